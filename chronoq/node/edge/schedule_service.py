"""gRPC servicer of recurring schedules."""

from __future__ import annotations

from typing import Any

import grpc

from chronoq.api import convert
from chronoq.api.v1 import schedules_pb2, schedules_pb2_grpc
from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.errors import InvalidArgument
from chronoq.limits import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_PAGE_TOKEN,
    check_name,
    check_range,
    check_text,
)
from chronoq.node.edge.status import translated
from chronoq.store.port import ScheduleAdmin

Ctx = grpc.aio.ServicerContext[Any, Any]


class ScheduleService(schedules_pb2_grpc.ScheduleServiceServicer):
    def __init__(self, schedules: ScheduleAdmin, clock: Clock, settings: NodeSettings) -> None:
        self._schedules = schedules
        self._clock = clock
        self._settings = settings

    @translated
    async def CreateSchedule(
        self, request: schedules_pb2.ScheduleSpec, context: Ctx
    ) -> schedules_pb2.Schedule:
        now = self._clock.now()
        spec = self._settings.limits.check_schedule(
            convert.schedule_spec_from_pb(request, now, self._settings.defaults), now
        )
        created = await self._schedules.create(
            spec,
            now,
            cap=self._settings.schedules_per_namespace,
            quota=self._settings.submit_quota,
        )
        return convert.schedule_to_pb(created)

    @translated
    async def GetSchedule(
        self, request: schedules_pb2.ScheduleRef, context: Ctx
    ) -> schedules_pb2.Schedule:
        ns, name = _ref(request)
        return convert.schedule_to_pb(await self._schedules.get(ns, name))

    @translated
    async def ListSchedules(
        self, request: schedules_pb2.ListSchedulesRequest, context: Ctx
    ) -> schedules_pb2.ListSchedulesResponse:
        ns = check_name("namespace", convert.namespace_of(request.namespace))
        check_range("page_size", request.page_size, 0, MAX_PAGE_SIZE)
        check_text("page_token", request.page_token, MAX_PAGE_TOKEN)
        _check_page_token(request.page_token)
        size = request.page_size or DEFAULT_PAGE_SIZE
        page = await self._schedules.list_page(ns, page_size=size, after=request.page_token)
        return schedules_pb2.ListSchedulesResponse(
            schedules=[convert.schedule_to_pb(s) for s in page],
            next_page_token=page[-1].spec.name if len(page) == size else "",
        )

    @translated
    async def PauseSchedule(
        self, request: schedules_pb2.ScheduleRef, context: Ctx
    ) -> schedules_pb2.Schedule:
        ns, name = _ref(request)
        return convert.schedule_to_pb(await self._schedules.pause(ns, name, self._clock.now()))

    @translated
    async def ResumeSchedule(
        self, request: schedules_pb2.ScheduleRef, context: Ctx
    ) -> schedules_pb2.Schedule:
        ns, name = _ref(request)
        resumed = await self._schedules.resume(
            ns, name, self._clock.now(), quota=self._settings.submit_quota
        )
        return convert.schedule_to_pb(resumed)

    @translated
    async def DeleteSchedule(
        self, request: schedules_pb2.ScheduleRef, context: Ctx
    ) -> schedules_pb2.DeleteScheduleResponse:
        ns, name = _ref(request)
        await self._schedules.delete(ns, name, self._clock.now())
        return schedules_pb2.DeleteScheduleResponse()


def _check_page_token(token: str) -> None:
    """A page token is the name of the last schedule of the previous page: anything that
    cannot be a name came from nowhere else, and would silently list from an odd place."""
    if not token:
        return
    try:
        check_name("page_token", token)
    except InvalidArgument:
        raise InvalidArgument("page_token", "is not a token from a previous page") from None


def _ref(request: schedules_pb2.ScheduleRef) -> tuple[str, str]:
    if not request.name:
        raise InvalidArgument("name", "is required")
    return convert.namespace_of(request.namespace), check_name("name", request.name)
