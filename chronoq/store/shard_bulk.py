"""The store of shards' bulk operations by filter: each round of the walk is one batch on
every shard after the same position, concurrently (``chronoq.store.bulk``).

A shard that refuses its batch because a partition is moving (``PartitionMoved``: nothing of
that statement was written) makes the round go again from the same position once the map is
refreshed, so no task of a moving partition is passed over; what the other shards committed
in that round is counted (their rows left the states walked, so the round again changes
nothing twice). A shard down fails the call (its tasks would be passed over for good); the
caller's next call goes on from its token.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

from chronoq.errors import PartitionMoved
from chronoq.limits import BULK_DEADLINE_S, MAX_BULK_TASKS
from chronoq.store.bulk import Batch, walk
from chronoq.store.shard_routing import ShardRouting
from chronoq.taskfilter import BulkAction, BulkDone, TaskFilter

#: Tries of a round a moving partition may refuse before the call gives up, and the pause
#: after each (after the map's refresh): about 3 s in all, past a move's cut-over freeze
#: (about a second per group of partitions).
MOVED_TRIES = 12
MOVED_PAUSE_S = 0.25


class ShardBulk(ShardRouting):
    """Bulk operations by filter over every shard."""

    async def bulk_where(
        self,
        action: BulkAction,
        namespace: str,
        where: TaskFilter,
        now: datetime,
        *,
        dry_run: bool = False,
        page_token: str = "",
        max_tasks: int = MAX_BULK_TASKS,
        deadline_s: float = BULK_DEADLINE_S,
    ) -> BulkDone:
        if (solo := self._fast()) is not None:
            return await solo.bulk_where(
                action,
                namespace,
                where,
                now,
                dry_run=dry_run,
                page_token=page_token,
                max_tasks=max_tasks,
                deadline_s=deadline_s,
            )

        async def one_round(after: uuid.UUID, batch: int) -> list[Batch]:
            counted: list[Batch] = []
            for _try in range(MOVED_TRIES):
                names = [s for s in self._routing().shards if s in self._stores]
                answers = await asyncio.gather(
                    *(
                        self._on(
                            n,
                            lambda s: s.bulk_batch(
                                action, namespace, where, after, batch, now, dry_run=dry_run
                            ),
                        )
                        for n in names
                    ),
                    return_exceptions=True,
                )
                failed = [a for a in answers if isinstance(a, BaseException)]
                done = [a for a in answers if isinstance(a, Batch)]
                if not failed:
                    return counted + done
                if not all(isinstance(a, PartitionMoved) for a in failed):
                    raise next(a for a in failed if not isinstance(a, PartitionMoved))
                if not dry_run:  # committed: counted, and not walked into again
                    counted += [Batch(b.count, None, queues=b.queues) for b in done]
                await self._refreshed()
                await asyncio.sleep(MOVED_PAUSE_S)
            raise failed[0]

        return await walk(
            one_round,
            shards=len(self._stores),
            namespace=namespace,
            action=action,
            dry_run=dry_run,
            page_token=page_token,
            max_tasks=max_tasks,
            deadline_s=deadline_s,
        )
