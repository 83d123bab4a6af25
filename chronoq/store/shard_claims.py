"""The store of shards by queue: claims merged over every shard's head of its queues, and
queue limits on the map's first shard (``chronoq.store.sharded``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

from chronoq import errors
from chronoq.errors import StoreUnavailable
from chronoq.limits import MAX_ANSWER_BYTES, task_bytes
from chronoq.models import Lease, Task
from chronoq.store import fanout
from chronoq.store.shard_ids import ByTaskId
from chronoq.store.store import Store

log = logging.getLogger("chronoq.store")

#: Claimed (namespace, queues) remembered as ready on one shard alone (forgotten all at once
#: past this).
SOLE_ENTRIES = 4096


class ShardClaims(ByTaskId):
    """Claims over the shards; queue limits and their tokens on the limits' shard."""

    async def claim(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        max_tasks: int,
        now: datetime,
        *,
        limited: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
        keyed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> list[Task]:
        """Up to ``max_tasks`` across the shards; a limited queue's tokens are taken on the
        limits' shard first, and those not used given back. A keyed queue's keys each live
        on one shard, which decides its limits alone; the shards' heads of a keyed queue
        count only the tasks a claim could start (``key_claims.key_heads``)."""
        if (solo := self._fast()) is not None:
            return await solo.claim(
                namespace,
                queues,
                worker_id,
                max_tasks,
                now,
                limited=limited,
                keyed=keyed,
                max_bytes=max_bytes,
            )
        tasks: list[Task] = []
        capped = [q for q in queues if (namespace, q) in limited]
        free = [q for q in queues if (namespace, q) not in limited]
        budget = [max_bytes]
        mine = frozenset(k for k in keyed if k[0] == namespace)
        for queue in capped:
            if len(tasks) >= max_tasks:
                break
            tasks += await self._claim_limited(
                namespace, queue, worker_id, max_tasks - len(tasks), now, budget, mine
            )
        if free and len(tasks) < max_tasks:
            tasks += await self._claim_across(
                namespace, free, worker_id, max_tasks - len(tasks), now, budget, mine
            )
        tasks.sort(key=lambda t: (-t.priority, t.run_at))
        return tasks

    async def _claim_limited(
        self,
        namespace: str,
        queue: str,
        worker_id: str,
        want: int,
        now: datetime,
        budget: list[int],
        keyed: frozenset[tuple[str, str]] = frozenset(),
    ) -> list[Task]:
        """One limited queue: its tokens taken on the limits' shard, the claim across the
        shards, the tokens it did not use given back."""
        home = self._limits_shard
        granted = await self._on(home, lambda s: s.take_tokens(namespace, queue, want, now))
        cap = want if granted is None else granted
        if cap <= 0:
            return []
        got = await self._claim_across(namespace, [queue], worker_id, cap, now, budget, keyed)
        if granted is not None and cap > len(got):
            await self._on(home, lambda s: s.return_tokens(namespace, queue, cap - len(got)))
        return got

    async def _claim_across(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        want: int,
        now: datetime,
        budget: list[int],
        keyed: frozenset[tuple[str, str]] = frozenset(),
    ) -> list[Task]:
        """Claim up to ``want`` of the best tasks (priority, then run_at) over the shards,
        within ``budget[0]`` bytes (always one task in all); a down shard is skipped.

        Each shard's head of the queues (at most ``want`` READY tasks, read without locks)
        is merged first (``fanout.claim_shares``) into how many each shard claims: when one
        shard holds the best, it claims alone, as one store does; when several do, each
        claims its share under a strict share of the byte budget. Every task leased is in
        the answer, so no attempt is spent on a task no worker gets. A shard whose head
        changed in between (another claim took it) claims fewer: a claim is at most
        ``want``; one that got nothing while heads were there claims on the best head's
        shard alone."""
        key = (namespace, tuple(queues))
        sole = self._sole.get(key)
        got: list[Task] = []
        if sole is not None and sole in self._stores:
            got, heads = await self._claim_sole(
                namespace, queues, worker_id, want, now, budget, sole, keyed
            )
            if not heads:
                return got
            want -= len(got)
            if want <= 0 or budget[0] <= 0:
                return got
        else:
            heads = await self._every(
                lambda s: s.ready_heads(namespace, queues, want, worker_id, keyed=keyed, now=now)
            )
        shares = fanout.claim_shares(
            {n: h for n, h in heads.items() if h}, want, max(1, budget[0]), started=bool(got)
        )
        if len(self._sole) >= SOLE_ENTRIES:
            self._sole.clear()
        ready = [n for n, h in heads.items() if h]
        if len(ready) == 1 and not got and len(heads) == len(self._stores):
            self._sole[key] = ready[0]
        else:
            self._sole.pop(key, None)
        if not shares:
            return got
        lead = next(iter(shares))  # the shard of the best head (claim_shares keeps that order)
        if len(shares) == 1 and not got:
            more = await self._claim_one(
                namespace, queues, worker_id, want, now, budget[0], lead, keyed
            )
        else:
            more = await self._claim_shares(
                namespace, queues, worker_id, now, budget[0], shares, keyed
            )
            if not more and not got:
                more = await self._claim_one(
                    namespace, queues, worker_id, want, now, budget[0], lead, keyed
                )
        for task in more:
            budget[0] -= task_bytes(task)
        got += more
        got.sort(key=lambda t: (-t.priority, t.run_at))
        return got

    async def _claim_sole(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        want: int,
        now: datetime,
        budget: list[int],
        sole: str,
        keyed: frozenset[tuple[str, str]] = frozenset(),
    ) -> tuple[list[Task], dict[str, list[fanout.Head]]]:
        """The last claim of these queues found ready tasks on ``sole`` alone: claim there
        and read the other shards' heads at once (one round trip while that stays so).
        Answers the tasks and the other shards' non-empty heads."""
        others = [n for n in self._routing().shards if n != sole and n in self._stores]

        async def heads_elsewhere() -> dict[str, list[fanout.Head]]:
            answers = await asyncio.gather(
                *(
                    self._on(
                        n,
                        lambda s: s.ready_heads(
                            namespace, queues, want, worker_id, keyed=keyed, now=now
                        ),
                    )
                    for n in others
                ),
                return_exceptions=True,
            )
            out: dict[str, list[fanout.Head]] = {}
            for name, answer in zip(others, answers, strict=True):
                if isinstance(answer, StoreUnavailable):
                    self._skipped(name, answer)
                elif isinstance(answer, BaseException):
                    raise answer
                elif answer:
                    out[name] = answer
            return out

        claimed, heads = await asyncio.gather(
            self._claim_one(namespace, queues, worker_id, want, now, budget[0], sole, keyed),
            heads_elsewhere(),
            return_exceptions=True,
        )
        if isinstance(heads, BaseException):  # the claim stands; the next one reads again
            log.warning("ready heads of %s not read beside a claim: %s", others, heads)
            heads = {}
        if isinstance(claimed, StoreUnavailable):
            self._skipped(sole, claimed)
            self._sole.pop((namespace, tuple(queues)), None)
            claimed = []
        elif isinstance(claimed, BaseException):
            raise claimed
        for task in claimed:
            budget[0] -= task_bytes(task)
        if heads or not claimed:
            self._sole.pop((namespace, tuple(queues)), None)
        return claimed, heads

    async def _claim_one(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        want: int,
        now: datetime,
        max_bytes: int,
        shard: str,
        keyed: frozenset[tuple[str, str]] = frozenset(),
    ) -> list[Task]:
        """One shard's claim of up to ``want`` within ``max_bytes`` (the first always comes)."""
        return await self._on(
            shard,
            lambda s: s.claim(
                namespace, queues, worker_id, want, now, keyed=keyed, max_bytes=max(1, max_bytes)
            ),
        )

    async def _claim_shares(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        now: datetime,
        max_bytes: int,
        shares: Mapping[str, tuple[int, int]],
        keyed: frozenset[tuple[str, str]] = frozenset(),
    ) -> list[Task]:
        """Each shard claims its share concurrently, within its share of ``max_bytes`` (plus
        an even part of what the shares leave), strictly: together never past ``max_bytes``."""
        spare = max(0, max_bytes - sum(b for _n, b in shares.values())) // len(shares)

        def claiming(n: int, b: int) -> Callable[[Store], Awaitable[list[Task]]]:
            return lambda s: s.claim(
                namespace,
                queues,
                worker_id,
                n,
                now,
                keyed=keyed,
                max_bytes=b + spare,
                strict_bytes=True,
            )

        names = list(shares)
        answers = await asyncio.gather(
            *(self._on(shard, claiming(*shares[shard])) for shard in names),
            return_exceptions=True,
        )
        got: list[Task] = []
        down: list[StoreUnavailable] = []
        failure: BaseException | None = None
        for shard, answer in zip(names, answers, strict=True):
            if isinstance(answer, StoreUnavailable):
                self._skipped(shard, answer)
                down.append(answer)
            elif isinstance(answer, BaseException):
                failure = answer
            else:
                got += answer
        if failure is not None:  # not an outage: what the others leased goes back READY
            await asyncio.gather(*(self._give_back(namespace, t) for t in got))
            raise failure
        if len(down) == len(names):
            raise down[0]
        return got

    async def _give_back(self, namespace: str, task: Task) -> None:
        """A task leased by a claim that then failed goes back to READY; if that fails its
        lease runs out and the reaper retries it."""
        try:
            await self.release(namespace, Lease(task.id, task.attempt))
        except (StoreUnavailable, errors.StaleLease, errors.TaskNotFound) as exc:
            log.warning("claimed task %s past the byte budget not given back: %s", task.id, exc)

    async def ready_counts(
        self, keys: Sequence[tuple[str, str]], caps: Sequence[int]
    ) -> dict[tuple[str, str], int]:
        if (solo := self._fast()) is not None:
            return await solo.ready_counts(keys, caps)
        if not keys:
            return {}
        answers = await self._every(lambda s: s.ready_counts(keys, caps))
        return fanout.capped_sums(answers.values(), dict(zip(keys, caps, strict=True)))

    async def queue_limits(self) -> dict[tuple[str, str], tuple[float, float]]:
        if (solo := self._fast()) is not None:
            return await solo.queue_limits()
        return await self._on(self._limits_shard, lambda s: s.queue_limits())

    async def set_queue_limit(
        self,
        namespace: str,
        queue: str,
        rate: float,
        burst: float,
        now: datetime,
        *,
        cap: int,
    ) -> None:
        if (solo := self._fast()) is not None:
            return await solo.set_queue_limit(namespace, queue, rate, burst, now, cap=cap)
        return await self._on(
            self._limits_shard,
            lambda s: s.set_queue_limit(namespace, queue, rate, burst, now, cap=cap),
        )
