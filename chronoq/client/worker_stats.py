"""What a worker did: the counts ``Worker.run()`` returns, kept up to date while it runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerStats:
    claimed: int = 0
    claimed_on_ack: int = 0  # of ``claimed``, those whose claim rode on an ack batch
    succeeded: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0  # lease lost or task cancelled while running
    ack_retries: int = 0  # ack batches sent again after a failed attempt
    acks_dropped: int = 0  # successes never acknowledged (their tasks will run again)
