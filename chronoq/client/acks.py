"""A worker's acknowledgements of successes, in batches.

Successes are gathered into one batch (waiting ``delay`` for more, up to ``batch``), and each
batch is sent by its own task, at most ``ACK_BATCHES_IN_FLIGHT`` at once, so a batch stuck on
a slow node does not hold up the next ones. A batch may carry a claim for the slots it frees
(the worker decides how many). One that fails is sent again (completes are safe to repeat:
the same lease token gets the same answer) until shortly before each task's lease would
expire, and only then given up with a log line: the task then runs again, as at-least-once
allows. A gathering pass that fails puts its batch back, so a stop never waits on a lost ack.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from chronoq import errors
from chronoq.client.outage import Outage
from chronoq.client.worker_stats import WorkerStats
from chronoq.models import AckOutcome, Lease

log = logging.getLogger("chronoq.worker")

#: Ack batches sent at once: a batch stuck on a slow node does not hold up the next ones.
ACK_BATCHES_IN_FLIGHT = 4
#: First pause before a failed ack batch is sent again; it doubles up to ``ACK_RETRY_MAX``.
ACK_RETRY_INITIAL = 0.2
ACK_RETRY_MAX = 2.0
#: An ack is given up this long before its lease would expire (the node then re-runs it).
ACK_GIVE_UP_MARGIN = 0.5
#: Errors after which an ack is worth sending again: the node or its store did not answer,
#: or a rate limit said "later".
_TRANSIENT = (errors.Unavailable, errors.ResourceExhausted)


@dataclass(frozen=True)
class Ack:
    lease: Lease
    give_up_at: float  # loop time


#: One attempt at completing a batch, claiming ``ask`` tasks on the way when ``ask`` > 0.
Complete = Callable[[list[Ack], int], Awaitable[list[AckOutcome]]]


class AckBatches:
    """The acks of one worker: ``add`` a success; the worker's supervisor runs ``gather``
    again and again; ``complete`` sends a batch (the worker's call: over its stream, or with
    a claim riding on it), and ``claim_size`` says how many tasks the next batch claims (and
    reserves them)."""

    def __init__(
        self,
        stats: WorkerStats,
        complete: Complete,
        claim_size: Callable[[], int],
        *,
        batch: int,
        delay: float,
    ) -> None:
        self._stats = stats
        self._complete = complete
        self._claim_size = claim_size
        self.batch = batch
        self.delay = delay
        self._queue: asyncio.Queue[Ack] = asyncio.Queue()
        self._senders: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(ACK_BATCHES_IN_FLIGHT)
        self._gathering = False  # acks held by ``gather``, not handed to a sender yet
        self._outage = Outage("acks", log)

    def add(self, lease: Lease, lease_deadline: float) -> None:
        """A success to acknowledge before ``lease_deadline`` (loop time)."""
        self._queue.put_nowait(Ack(lease, lease_deadline - ACK_GIVE_UP_MARGIN))

    def waiting(self) -> bool:
        """Acks wait to be gathered, or are being gathered, into a batch."""
        return self._gathering or not self._queue.empty()

    async def join(self) -> None:
        """Until every ack landed, was refused or was given up."""
        await self._queue.join()

    async def cancel_senders(self) -> None:
        for sender in list(self._senders):
            sender.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)

    async def gather(self) -> None:
        """Gather successes into one batch and hand it to its own sender task, with a claim
        for the slots free at that moment. A pass that fails puts its batch back (and its
        sender slot), so the next pass sends it and ``join`` never waits on a lost ack."""
        batch = [await self._queue.get()]
        acquired = False
        try:
            self._gathering = True
            try:
                if self.delay:
                    await asyncio.sleep(self.delay)
                while len(batch) < self.batch and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                await self._slots.acquire()
                acquired = True
            finally:
                self._gathering = False
            self._hand_off(batch)
        except BaseException:
            if acquired:
                self._slots.release()
            # Back in the queue, but never past its give-up time: a stop waits for them.
            for ack in self._still_worth_sending(batch, asyncio.get_running_loop().time()):
                self._queue.put_nowait(ack)
            for _ in batch:
                self._queue.task_done()
            raise

    def _hand_off(self, batch: list[Ack]) -> None:
        """Start the sender of ``batch``, which holds one of the ack slots."""
        ask = self._claim_size()
        sender = asyncio.create_task(self._send(batch, ask), name="chronoq-ack-batch")
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)

    async def _send(self, batch: list[Ack], ask: int = 0) -> None:
        """Complete a batch, sending it again while it fails, until each ack's give-up time.
        Only the first attempt carries the claim of ``ask`` tasks."""
        loop = asyncio.get_running_loop()
        pause = ACK_RETRY_INITIAL
        pending = batch
        try:
            while pending:
                try:
                    outcomes = await self._complete(pending, ask)
                except errors.RemoteError as err:
                    if not isinstance(err, _TRANSIENT):
                        self._stats.acks_dropped += len(pending)
                        log.warning("completing %d tasks refused: %s", len(pending), err)
                        return
                    failure: Exception = err
                except Exception as err:  # noqa: BLE001 - a bug: the batch goes again
                    failure = err
                else:
                    self._outage.ended()
                    for o in outcomes:
                        if not o.ok:
                            log.warning("completion of %s refused: %s", o.task_id, o.error)
                    return
                ask = 0
                self._outage.failed(failure)
                pending = self._still_worth_sending(pending, loop.time() + pause)
                if pending:
                    self._stats.ack_retries += 1
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, ACK_RETRY_MAX)
        finally:
            self._slots.release()
            for _ in batch:
                self._queue.task_done()

    def _still_worth_sending(self, acks: list[Ack], next_try: float) -> list[Ack]:
        """The acks whose leases outlive the next attempt; the others are given up."""
        keep = [a for a in acks if a.give_up_at > next_try]
        dropped = len(acks) - len(keep)
        if dropped:
            self._stats.acks_dropped += dropped
            log.warning(
                "gave up acknowledging %d tasks (their leases expire): they will run again",
                dropped,
            )
        return keep
