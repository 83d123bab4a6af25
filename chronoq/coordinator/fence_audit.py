"""The fence audit: an owner takes its fences again where the store went back in time.

Tokens only grow, so a stored token older than the owner's means the store went back in time
(a failover to a standby that had not received the last commits). Until fixed, every owner
write would match nothing: the partition would not fire at all. Raising the fence to the
owner's token again is what ``take_fence`` does on a claim; it stays refused when a newer
owner exists. A newer token than the owner's means the partition is lost: its writes are
fenced, and etcd tells the owner to let go.

Only what a store answered is judged: a partition on a shard that is down or slow (the read
over several shards skips it) is audited on a later pass, not taken for one whose fence the
store lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from chronoq.store.rows import Fence

log = logging.getLogger("chronoq.coordinator")


class FenceStore(Protocol):
    """The store's fences, as the audit reads and takes them."""

    async def fences_of(self, partitions: Sequence[int]) -> dict[int, Fence | None]: ...

    async def take_fence(
        self, partition: int, token: int, cluster_id: str, owner: str
    ) -> Fence | None: ...


async def audit_fences(
    store: FenceStore, owned: Mapping[int, int], cluster_id: str, node_id: str
) -> set[int]:
    """Take the fences of ``owned`` (partition → token) again where ``store`` holds an older
    token of this cluster, or none; the partitions retaken (see the module docstring)."""
    if not owned:
        return set()
    stored = await store.fences_of(sorted(owned))
    retaken: set[int] = set()
    for partition, token in sorted(owned.items()):
        if partition not in stored:
            continue  # its shard did not answer: nothing is known of its fence
        fence = stored[partition]
        if fence is not None and (fence.cluster_id != cluster_id or fence.token >= token):
            if fence.token > token and fence.cluster_id == cluster_id:
                log.warning(
                    "partition %d: the store holds a newer token (%d > %d); not firing it",
                    partition, fence.token, token,
                )  # fmt: skip
            continue
        if await store.take_fence(partition, token, cluster_id, node_id):
            retaken.add(partition)
            log.warning(
                "partition %d: the store had lost this owner's fence (it holds %s, ours is "
                "%d): taken again",
                partition, "none" if fence is None else fence.token, token,
            )  # fmt: skip
    return retaken
