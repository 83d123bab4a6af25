"""A cron schedule in a time zone: every weekday at 09:00 in Paris, whatever the season.

    python examples/cron_in_time_zone.py 127.0.0.1:7070

Creates (or replaces) the schedule, then prints its next occurrence in UTC and in Paris: the
UTC hour moves with daylight saving time, the Paris hour does not. The owner of the schedule's
partition makes each occurrence an ordinary task a minute ahead.
"""

from __future__ import annotations

import asyncio
import sys
from zoneinfo import ZoneInfo

from chronoq.client import Client
from chronoq.errors import NotFound
from chronoq.recurrence import CatchUp

PARIS = ZoneInfo("Europe/Paris")


async def main(address: str) -> None:
    async with Client(address) as client:
        try:
            await client.delete_schedule("paris-morning-report")
        except NotFound:
            pass
        schedule = await client.create_schedule(
            "paris-morning-report",
            "reports",
            cron="0 9 * * 1-5",
            timezone="Europe/Paris",
            catch_up=CatchUp.LATEST,  # after downtime: run the missed morning once, not all
            payload=b'{"report": "daily"}',
        )
        local = schedule.next_fire_at.astimezone(PARIS)
        print("next occurrence (UTC):  ", schedule.next_fire_at.isoformat())
        print("next occurrence (Paris):", local.isoformat())
        assert (local.hour, local.minute) == (9, 0), local
        assert local.weekday() < 5, local


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7070"))
