"""One settings object for a scheduler node: keyword-only, typed defaults.

The CLI maps every flag to a ``CHRONOQ_*`` environment variable; code builds ``NodeSettings``
directly.
"""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from chronoq.auth import ScrapeToken
from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS, MAX_PARTITIONS
from chronoq.cardinality import DEFAULT_METRICS_QUEUES, MAX_METRICS_QUEUES
from chronoq.coordinator.settings import ClusterSettings
from chronoq.errors import ConfigError
from chronoq.history_slices import MAX_HISTORY_AFTER, check_history_settings
from chronoq.limits import Limits
from chronoq.models import TaskDefaults
from chronoq.redact import mask_dsn
from chronoq.shardmap import MAX_SHARDS, shard_name

#: The longest timing-wheel horizon: past a minute the tick costs no more than the wheel.
MAX_WHEEL_HORIZON = timedelta(seconds=60)
#: The most tasks a timing wheel may hold (a few hundred megabytes at this bound).
MAX_WHEEL_CAPACITY = 1_000_000

#: Long-polling claims one namespace may hold open on a node at once (more: RESOURCE_EXHAUSTED).
DEFAULT_LONG_POLLS_PER_NAMESPACE = 256
#: Long-polling claims a node holds open at once, all namespaces together.
DEFAULT_LONG_POLLS_PER_NODE = 1024

#: Schedules one namespace may hold (CreateSchedule past it: RESOURCE_EXHAUSTED).
DEFAULT_SCHEDULES_PER_NAMESPACE = 1000
#: Queue dispatch limits one namespace may set (SetQueueLimit past it: RESOURCE_EXHAUSTED).
DEFAULT_QUEUE_LIMITS_PER_NAMESPACE = 100


#: How often a node's firing loop runs: the upper bound of a task's wait behind its instant
#: when nothing fires it sooner.
DEFAULT_TICK = timedelta(milliseconds=100)


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """Everything a node needs to run."""

    dsn: str
    host: str = "127.0.0.1"
    port: int = 7070  # 0: pick a free port
    node_id: str = field(default_factory=lambda: f"node-{uuid.uuid4().hex[:8]}")
    partitions: int = DEFAULT_PARTITIONS
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS
    tick: timedelta = DEFAULT_TICK
    fire_batch: int = 5000  # rows per firing statement, spread over the owned partitions
    fire_rounds: int = 20  # statements per tick at most, before yielding to the next tick
    reap_interval: timedelta = timedelta(seconds=1)
    reap_batch: int = 1000
    # How often the node re-checks the store for the queues its long-polls wait on (one shared
    # statement, whatever the number of waiters): the path for tasks made ready on another
    # node while notices (ready_notices) are off or not heard; 10x slower (at most 5 s) while
    # they are.
    claim_poll: timedelta = timedelta(milliseconds=500)
    max_claim_wait: timedelta = timedelta(seconds=60)
    long_polls_per_namespace: int = DEFAULT_LONG_POLLS_PER_NAMESPACE
    long_polls_per_node: int = DEFAULT_LONG_POLLS_PER_NODE
    # Nodes tell each other through PostgreSQL NOTIFY which queues have new ready tasks, so a
    # task fired on one node wakes the long-polls of all at once (claim_poll is then only a
    # slow fallback). False: the claim_poll re-check is the only path between nodes.
    ready_notices: bool = True
    # The wheel fires a task straight to a worker stream of this node that waits on its queue
    # and has free credits (SCHEDULED -> RUNNING in one write; see chronoq.node.dispatch.handoff).
    # False: fired tasks always go READY and wait for a claim.
    handoff: bool = True
    # Owners keep the tasks due within this horizon in a timing wheel (at most wheel_capacity)
    # and fire each at its instant; the tick fires the rest. 0: the tick alone (firing up to a
    # tick late).
    wheel_horizon: timedelta = timedelta(seconds=2)
    wheel_capacity: int = 100_000
    # With the wheel on, the tick is the catch-all for what the wheel does not hold, and runs
    # this often while it finds nothing late (every tick again as soon as it does).
    catch_all: timedelta = timedelta(seconds=1)
    schedule_interval: timedelta = timedelta(seconds=1)  # how often owners materialise schedules
    schedule_lookahead: timedelta = timedelta(seconds=60)  # occurrences created this far ahead
    max_batch: int = 10_000  # tasks per SubmitBatch
    pool_size: int = 10
    limits: Limits = field(default_factory=Limits)
    defaults: TaskDefaults = field(default_factory=TaskDefaults)
    cluster: ClusterSettings | None = None  # None: a single node owning every partition
    # The DSNs of store shards shard-1, shard-2, ... (``dsn`` is shard-0). The first node of a
    # cluster splits the partitions evenly over them; later nodes route by the map in etcd
    # and use these DSNs (with their passwords) to reach the shards the map names.
    store_shards: tuple[str, ...] = field(default=(), repr=False)
    tls_cert: str | None = None  # PEM paths: serve the API over TLS (None: plaintext)
    tls_key: str | None = None
    tls_client_ca: str | None = None  # mutual TLS: clients need a certificate this CA signed
    auth_tokens: str | None = None  # TOML token file (chronoq.auth); None: no auth
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # Prometheus /metrics; None: off, 0: any free port
    # The bearer token every scrape must send (chronoq.auth.ScrapeToken): a file holding it or
    # its sha256: digest, checked like a password file and read at start, or the text itself
    # (for containers, from the environment). Without one, /metrics serves on loopback only,
    # unless metrics_insecure: an operator's explicit choice of an open endpoint.
    metrics_token_file: str | None = None
    metrics_token: str | None = field(default=None, repr=False)
    metrics_insecure: bool = False
    # (namespace, queue) pairs exported with series of their own (the busiest); the others
    # are summed under queue="(other)" (chronoq.cardinality), so tenants do not set the count.
    metrics_queues: int = DEFAULT_METRICS_QUEUES
    retention: timedelta | None = timedelta(days=7)  # SUCCEEDED/CANCELLED/SKIPPED kept this long
    dead_retention: timedelta | None = timedelta(days=30)  # DEAD (the DLQ) kept this long
    retention_interval: timedelta = timedelta(seconds=60)
    # Finished tasks (SUCCEEDED/CANCELLED/SKIPPED) leave the live table for the task history
    # this long after they finish (0: at the next pass), and retention drops the history in
    # whole time slices of history_slice (chronoq.store.history): retention / history_slice
    # may need at most chronoq.history_slices.MAX_SLICES slices (None: a day, or wider when
    # the retention needs it: chronoq.history_slices.slice_width).
    history_after: timedelta = timedelta(seconds=60)
    history_slice: timedelta | None = None
    # How often the owners recount their partitions' queue counts (the QueueCounts RPC, the
    # queue gauges): at least this, and longer when a pass takes more than 5% of it.
    queue_counts_interval: timedelta = timedelta(seconds=2)
    retention_batch: int = 1000
    # No store for this long: hand the partitions off (default: 0.6 x the etcd lease TTL, so a node
    # cut off from PostgreSQL fails over as fast as one cut off from etcd).
    store_grace: timedelta | None = None
    # Off by more than this from the store's clock, a cluster node hands its partitions off
    # (chronoq.node.clock_check); None: never checked. Virtual clocks are never checked.
    max_clock_offset: timedelta | None = timedelta(milliseconds=500)
    submit_quota: float | None = None  # tasks/s per namespace on this node; None: unlimited
    submit_quota_burst: float | None = None  # default: one second's worth (at least 1)
    schedules_per_namespace: int = DEFAULT_SCHEDULES_PER_NAMESPACE
    queue_limits_per_namespace: int = DEFAULT_QUEUE_LIMITS_PER_NAMESPACE

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {self.partitions}"
            )
        if self.bucket_seconds < 1:
            raise ConfigError("bucket_seconds must be >= 1")
        if not timedelta(milliseconds=1) <= self.tick <= timedelta(seconds=60):
            raise ConfigError(f"tick must be between 1 ms and 60 s, got {self.tick}")
        if not timedelta(milliseconds=1) <= self.catch_all <= timedelta(seconds=60):
            raise ConfigError(f"catch_all must be between 1 ms and 60 s, got {self.catch_all}")
        if self.fire_batch < 1:
            raise ConfigError("fire_batch must be >= 1")
        if not timedelta(0) <= self.wheel_horizon <= MAX_WHEEL_HORIZON:
            raise ConfigError(
                f"wheel_horizon must be between 0 and {MAX_WHEEL_HORIZON}, got {self.wheel_horizon}"
            )
        if not 1 <= self.wheel_capacity <= MAX_WHEEL_CAPACITY:
            raise ConfigError(f"wheel_capacity must be between 1 and {MAX_WHEEL_CAPACITY}")
        if self.schedules_per_namespace < 1 or self.queue_limits_per_namespace < 1:
            raise ConfigError("schedules_per_namespace and queue_limits_per_namespace must be >= 1")
        if not 0 <= self.metrics_queues <= MAX_METRICS_QUEUES:
            raise ConfigError(f"metrics_queues must be between 0 and {MAX_METRICS_QUEUES}")
        if self.long_polls_per_namespace < 1 or self.long_polls_per_node < 1:
            raise ConfigError("long_polls_per_namespace and long_polls_per_node must be >= 1")
        self._check_history()
        self._check_metrics_access()
        check_store_shards(self.dsn, self.store_shards, self.partitions, self.cluster)

    def _check_history(self) -> None:
        """Refuse a history setting out of bounds (chronoq.history_slices)."""
        if not timedelta(0) <= self.history_after <= MAX_HISTORY_AFTER:
            raise ConfigError(
                f"history_after must be between 0 and {MAX_HISTORY_AFTER}, got {self.history_after}"
            )
        if self.history_slice is not None:
            check_history_settings(self.retention, self.history_slice)

    def _check_metrics_access(self) -> None:
        """Refuse a /metrics that whoever reaches its address could read."""
        if self.metrics_token is not None and self.metrics_token_file is not None:
            raise ConfigError(
                "give the metrics token once: --metrics-token-file or CHRONOQ_METRICS_TOKEN"
            )
        if self.metrics_token is not None:
            ScrapeToken(self.metrics_token, source="CHRONOQ_METRICS_TOKEN")
        if (
            self.metrics_port is None
            or self.metrics_insecure
            or self.metrics_token is not None
            or self.metrics_token_file is not None
            or is_loopback(self.metrics_host)
        ):
            return
        raise ConfigError(
            f"/metrics on {self.metrics_host} would be open to every host that reaches it: add "
            "--metrics-token-file FILE (a bearer token Prometheus sends), or serve it on "
            "--metrics-host 127.0.0.1"
        )


#: The longest DSN a node accepts for a store shard.
MAX_DSN_CHARS = 4096


def check_store_shards(
    dsn: str, shards: tuple[str, ...], partitions: int, cluster: ClusterSettings | None
) -> None:
    """Refuse extra store shards that cannot work; every DSN in a message is masked."""
    if not shards:
        return
    if cluster is None:
        raise ConfigError(
            "--store-shard needs --etcd: the shard map that places partitions on shards "
            "lives in etcd"
        )
    if 1 + len(shards) > min(partitions, MAX_SHARDS):
        raise ConfigError(
            f"{1 + len(shards)} store shards for {partitions} partitions: a shard holds at "
            f"least one partition (and a cluster has at most {MAX_SHARDS} shards)"
        )
    seen = {dsn.strip(): shard_name(0)}
    for number, shard in enumerate(shards, start=1):
        name = shard_name(number)
        text = shard.strip()
        if not text:
            raise ConfigError(f"--store-shard for {name} is empty: give a PostgreSQL DSN")
        if len(text) > MAX_DSN_CHARS:
            raise ConfigError(f"--store-shard for {name} is longer than {MAX_DSN_CHARS} chars")
        if "://" in text and not text.lower().startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                f"--store-shard for {name} ({mask_dsn(text)}) is not a PostgreSQL DSN: use "
                "postgresql://user@host:port/database"
            )
        if "://" not in text and "=" not in text:
            raise ConfigError(
                f"--store-shard for {name} ({mask_dsn(text)}) is not a DSN: use "
                "postgresql://user@host:port/database or libpq's key=value form"
            )
        if text in seen:
            raise ConfigError(
                f"--store-shard for {name} ({mask_dsn(text)}) is the DSN of {seen[text]}: "
                "each shard is its own database"
            )
        seen[text] = name


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) can be reached from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name, or "" (every interface)
