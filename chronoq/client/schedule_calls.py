"""The schedule calls of ``Client``: create, get, list, pause, resume and delete a recurring
schedule of the client's namespace."""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from chronoq import errors
from chronoq.api import convert
from chronoq.api.v1 import schedules_pb2
from chronoq.models import TASK_DEFAULTS, Schedule
from chronoq.recurrence import CatchUp


class ScheduleCalls:
    """``create_schedule``, ``get_schedule``, ``list_schedules``, ``pause_schedule``,
    ``resume_schedule`` and ``delete_schedule`` (a base of ``Client``, which provides
    ``_call``)."""

    namespace: str
    _call: Callable[..., Awaitable[Any]]

    async def create_schedule(
        self,
        name: str,
        queue: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        start_at: datetime | None = None,
        catch_up: CatchUp = CatchUp.LATEST,
        payload: bytes = b"",
        priority: int = TASK_DEFAULTS.priority,
        max_attempts: int | None = None,
        lease_timeout: timedelta | None = None,
    ) -> Schedule:
        """A recurring schedule: ``cron`` (5 fields, in ``timezone``) or ``every`` (interval)."""
        if (cron is None) == (every is None):
            raise errors.BadRequest("set exactly one of cron and every")
        pb = schedules_pb2.ScheduleSpec(
            namespace=self.namespace,
            name=name,
            queue=queue,
            timezone=timezone,
            payload=payload,
            priority=priority,
            catch_up=convert.catch_up_to_pb(catch_up),
        )
        if cron is not None:
            pb.cron = cron
        if every is not None:
            pb.interval.FromTimedelta(every)
        if start_at is not None:
            pb.start_at.FromDatetime(start_at)
        if max_attempts is not None:
            pb.retry.max_attempts = max_attempts
        if lease_timeout is not None:
            pb.lease_timeout.FromTimedelta(lease_timeout)
        return convert.schedule_from_pb(await self._call(lambda n: n.schedules.CreateSchedule, pb))

    def _ref(self, name: str) -> schedules_pb2.ScheduleRef:
        return schedules_pb2.ScheduleRef(namespace=self.namespace, name=name)

    async def get_schedule(self, name: str) -> Schedule:
        pb = await self._call(lambda n: n.schedules.GetSchedule, self._ref(name), retry=True)
        return convert.schedule_from_pb(pb)

    async def list_schedules(self) -> builtins.list[Schedule]:
        out: builtins.list[Schedule] = []
        token = ""
        while True:
            req = schedules_pb2.ListSchedulesRequest(namespace=self.namespace, page_token=token)
            resp = await self._call(lambda n: n.schedules.ListSchedules, req, retry=True)
            out += [convert.schedule_from_pb(s) for s in resp.schedules]
            if not resp.next_page_token:
                return out
            token = resp.next_page_token

    async def pause_schedule(self, name: str) -> Schedule:
        pb = await self._call(lambda n: n.schedules.PauseSchedule, self._ref(name))
        return convert.schedule_from_pb(pb)

    async def resume_schedule(self, name: str) -> Schedule:
        pb = await self._call(lambda n: n.schedules.ResumeSchedule, self._ref(name))
        return convert.schedule_from_pb(pb)

    async def delete_schedule(self, name: str) -> None:
        await self._call(lambda n: n.schedules.DeleteSchedule, self._ref(name))
