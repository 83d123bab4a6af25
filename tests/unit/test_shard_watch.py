"""The per-shard watch of a node (pure: a fake probe and a fake ownership) and the even
first map."""

from __future__ import annotations

import asyncio
import time

import pytest

from chronoq.config import NodeSettings
from chronoq.coordinator.settings import ClusterSettings, EtcdSettings
from chronoq.errors import ConfigError
from chronoq.node.housekeeping import reachable_elsewhere
from chronoq.node.shards import ShardWatch, cause, reach_dsn, without_masked_password
from chronoq.shardmap import ShardMap, ShardMapInvalid, even


class FakeOwnership:
    def __init__(self) -> None:
        self.held_out: dict[str, frozenset[int]] = {}
        self.suspended = False

    def hold_out(self, cause: str, partitions: frozenset[int], reason: str) -> None:
        self.held_out[cause] = partitions

    def bring_back(self, cause: str) -> None:
        self.held_out.pop(cause, None)

    async def suspend(self, reason: str = "") -> None:
        self.suspended = True

    async def resume(self) -> None:
        self.suspended = False


def test_even_splits_in_contiguous_ranges() -> None:
    m = even(10, 3)
    assert m.version == 1
    assert [m.held_by(s) for s in m.shards] == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]
    assert even(4, 1) == ShardMap(1, ("shard-0",), ("shard-0",) * 4)
    with pytest.raises(ShardMapInvalid):
        even(2, 3)


def watch(up: dict[str, bool], elsewhere: set[str], clock: list[float]) -> tuple[
    ShardWatch, FakeOwnership
]:
    async def probe(shard: str, _timeout: float) -> bool:
        return up[shard]

    own = FakeOwnership()
    w = ShardWatch(
        probe,
        lambda: even(16, 2),
        own,  # type: ignore[arg-type]
        grace=1.0,
        elsewhere=lambda s, _after: s in elsewhere,
        monotonic=lambda: clock[0],
    )
    return w, own


def test_a_shard_nobody_reaches_is_held_out_alone_and_brought_back() -> None:
    up, clock = {"shard-0": True, "shard-1": True}, [0.0]
    w, own = watch(up, set(), clock)
    asyncio.run(w.check())
    up["shard-1"] = False
    clock[0] = 0.5
    asyncio.run(w.check())
    assert own.held_out == {}  # within grace: nothing yet
    clock[0] = 1.6
    asyncio.run(w.check())
    assert own.held_out == {cause("shard-1"): frozenset(range(8, 16))}
    assert not own.suspended
    assert w.problems() == ["store shard-1 down: unreachable"]
    up["shard-1"] = True
    asyncio.run(w.check())
    assert own.held_out == {} and w.down == {}


def test_a_shard_lost_by_every_node_at_once_holds_out_only_its_partitions() -> None:
    """The others' last answers, published before the loss, are still fresh when this node
    gives up on the shard: they must not make it step out (every node would, and the other
    shard's partitions would stop firing with the down one's)."""
    up, clock = {"shard-0": True, "shard-1": True}, [0.0]
    seen: list[float] = []

    async def probe(shard: str, _timeout: float) -> bool:
        return up[shard]

    own = FakeOwnership()
    stats: dict[str, dict[str, float]] = {}

    def elsewhere(shard: str, after: float) -> bool:
        seen.append(after)
        return reachable_elsewhere(stats, "me", time.time(), fresh=10.0, after=after)

    w = ShardWatch(
        probe,
        lambda: even(16, 2),
        own,  # type: ignore[arg-type]
        grace=1.0,
        interval=0.2,
        elsewhere=elsewhere,
        monotonic=lambda: clock[0],
    )
    asyncio.run(w.check())
    up["shard-1"] = False
    clock[0] = 1.6
    # Another node answered shard-1 when this one last did, then lost it too.
    stats["other"] = {"store_ok_at": w.ok_epoch()["shard-1"]}
    asyncio.run(w.check())
    assert own.held_out == {cause("shard-1"): frozenset(range(8, 16))}
    assert not own.suspended
    assert seen and seen[-1] > stats["other"]["store_ok_at"]
    # Another node that answers it after this node lost it: this node steps out.
    stats["other"] = {"store_ok_at": time.time()}
    clock[0] = 2.0
    asyncio.run(w.check())
    assert own.suspended


def test_a_shard_others_reach_makes_the_node_step_out_until_it_answers() -> None:
    up, clock = {"shard-0": True, "shard-1": False}, [0.0]
    w, own = watch(up, {"shard-1"}, clock)
    clock[0] = 2.0
    asyncio.run(w.check())
    assert own.suspended and w.stepped_out
    up["shard-1"] = True
    asyncio.run(w.check())
    assert not own.suspended and not w.stepped_out


def test_the_registered_dsn_loses_its_mask_so_the_password_file_applies() -> None:
    assert without_masked_password("postgresql://app:***@db:5432/x") == "postgresql://app@db:5432/x"
    assert without_masked_password("host=db user=app password=*** dbname=x") == (
        "host=db user=app dbname=x"
    )
    own = ("postgresql://a:pw@h0/x", "postgresql://a:pw@h1/x")
    registered = {"shard-2": "postgresql://a:***@h2/x"}
    assert reach_dsn("shard-1", own, registered) == own[1]
    assert reach_dsn("shard-2", own, registered) == "postgresql://a@h2/x"
    assert reach_dsn("shard-3", own, registered) is None


def test_store_shards_are_checked_and_their_passwords_never_shown() -> None:
    cluster = ClusterSettings(etcd=EtcdSettings(endpoints=["127.0.0.1:2379"]))
    base = "postgresql://a:topsecret@h0/x"
    with pytest.raises(ConfigError, match="needs --etcd"):
        NodeSettings(dsn=base, store_shards=("postgresql://a:b@h1/x",))
    for bad, match in (
        ((base,), "is the DSN of shard-0"),
        (("mysql://a:topsecret@h/x",), "not a PostgreSQL DSN"),
        (("",), "empty"),
        (("postgresql://a:topsecret@h1/x",) * 2, "is the DSN of shard-1"),
    ):
        with pytest.raises(ConfigError, match=match) as caught:
            NodeSettings(dsn=base, cluster=cluster, store_shards=bad)
        assert "topsecret" not in str(caught.value)
    with pytest.raises(ConfigError, match="at least one partition"):
        NodeSettings(dsn=base, cluster=cluster, partitions=1, store_shards=("host=h1",))
    assert "h1" not in repr(
        NodeSettings(dsn=base, cluster=cluster, store_shards=("postgresql://a@h1/x",))
    )


def test_a_late_probe_round_does_not_take_the_others_earlier_answers_for_a_cut_off() -> None:
    """On a busy host this node's probe round comes 3 s after its last answer instead of 1 s.
    Another node's answer from 2.5 s, before this node's first failed probe, is from a shard
    that was still alive for everyone: this node holds the shard out and stays in. An
    answer after that failed probe shows a shard the others reach: it steps out."""
    up, clock = {"shard-0": True, "shard-1": True}, [0.0]
    stats: dict[str, dict[str, float]] = {}

    async def probe(shard: str, _timeout: float) -> bool:
        return up[shard]

    def epoch(mono: float) -> float:
        return time.time() - (clock[0] - mono)

    own = FakeOwnership()
    w = ShardWatch(
        probe,
        lambda: even(16, 2),
        own,  # type: ignore[arg-type]
        grace=1.0,
        interval=1.0,
        elsewhere=lambda _s, after: reachable_elsewhere(
            stats, "me", time.time(), fresh=10.0, after=after
        ),
        monotonic=lambda: clock[0],
    )
    asyncio.run(w.check())  # answered at 0.0
    up["shard-1"] = False
    clock[0] = 3.0  # the next round, late; the shard died at about 2.8 s for every node
    stats["other"] = {"store_ok_at": epoch(2.5)}
    asyncio.run(w.check())
    assert own.held_out == {cause("shard-1"): frozenset(range(8, 16))}
    assert not own.suspended
    clock[0] = 4.0
    stats["other"] = {"store_ok_at": epoch(3.5)}  # answered after this node's failed probe
    asyncio.run(w.check())
    assert own.suspended


def test_an_answer_is_stamped_when_it_came_not_when_the_slowest_probe_ended() -> None:
    clock = [0.0]

    async def probe(shard: str, _timeout: float) -> bool:
        if shard == "shard-0":
            await asyncio.sleep(0)  # shard-1 answers meanwhile, at once
            clock[0] += 2.0  # shard-0's answer is 2 s slow
        return True

    w = ShardWatch(
        probe,
        lambda: even(16, 2),
        FakeOwnership(),  # type: ignore[arg-type]
        grace=1.0,
        monotonic=lambda: clock[0],
    )
    asyncio.run(w.check())
    assert w.ok_at == {"shard-0": 2.0, "shard-1": 0.0}
