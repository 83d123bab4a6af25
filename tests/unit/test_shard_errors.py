"""The shard map's and the partition mover's errors live in chronoq.errors, under the one base,
and a node's edge answers each with the status its class declares and its message intact (what
to fix), which the client raises as the class of that status."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from chronoq import errors
from chronoq.client.remote import translate
from chronoq.node.edge.status import code_for, translated

#: Each error, where it was raised from before (still importable there), and its status.
CASES: list[tuple[errors.ChronoqError, str, grpc.StatusCode, type[errors.RemoteError]]] = [
    (
        errors.ShardMapInvalid("the shard map is absent from etcd: start a node first"),
        "chronoq.shardmap",
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.PreconditionFailed,
    ),
    (
        errors.ShardMapConflict("the shard map changed meanwhile: run the move again"),
        "chronoq.shardmap",
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.PreconditionFailed,
    ),
    (
        errors.ShardAdminRefused("a move is cutting over: add the shard in a moment"),
        "chronoq.node.shard_admin",
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.PreconditionFailed,
    ),
    (
        errors.MoveRecordInvalid("move record: not valid JSON"),
        "chronoq.moves",
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.PreconditionFailed,
    ),
    (
        errors.MoveRefused("move 'm1': the source shard does not hold partition 3 live"),
        "chronoq.store.mover",
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.PreconditionFailed,
    ),
    (
        errors.StaleMoveToken("m1", 5, 9),
        "chronoq.store.mover",
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.PreconditionFailed,
    ),
    (
        errors.MoveLost("move m1: this node no longer holds its key"),
        "chronoq.coordinator.move_book",
        grpc.StatusCode.UNAVAILABLE,
        errors.Unavailable,
    ),
    (
        errors.FreezeOverrun("move 'm1': the frozen last round took over 5.0 s"),
        "chronoq.store.mover",
        grpc.StatusCode.UNAVAILABLE,
        errors.Unavailable,
    ),
    (
        errors.FreezeTimedOut("move 'm1': writes in flight did not finish within 5 s"),
        "chronoq.store.holdings",
        grpc.StatusCode.UNAVAILABLE,
        errors.Unavailable,
    ),
]


def _id(case: Any) -> str:
    return type(case).__name__ if isinstance(case, errors.ChronoqError) else str(case)


@pytest.mark.parametrize(("exc", "was_in", "code", "remote"), CASES, ids=_id)
def test_a_shard_error_is_one_class_of_chronoq_errors(
    exc: errors.ChronoqError, was_in: str, code: grpc.StatusCode, remote: type[errors.RemoteError]
) -> None:
    import importlib

    cls = type(exc)
    assert cls.__module__ == "chronoq.errors"
    assert issubclass(cls, errors.ChronoqError)
    # The modules that raise it still name the very same class (no second definition).
    assert getattr(importlib.import_module(was_in), cls.__name__) is cls
    assert code_for(exc) is code
    assert errors.remote_error_class(code.name) is remote


class _Aborted(Exception):
    pass


class _Context:
    """The part of a servicer context the edge uses: abort with a code and a message."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted


class _Rpc(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(("exc", "was_in", "code", "remote"), CASES, ids=_id)
async def test_the_edge_answers_its_status_with_the_message_and_the_client_raises_it(
    exc: errors.ChronoqError, was_in: str, code: grpc.StatusCode, remote: type[errors.RemoteError]
) -> None:
    del was_in

    class Servicer:
        @translated
        async def MovePartitions(self, request: Any, context: Any) -> Any:
            raise exc

    context = _Context()
    with pytest.raises(_Aborted):
        await Servicer().MovePartitions(None, context)
    assert context.aborted == (code, exc.message)
    assert exc.message  # says what to fix, never empty
    seen = translate(_Rpc(*context.aborted))
    assert type(seen) is remote
    assert exc.message in seen.message


def test_a_stale_move_token_says_which_mover_holds_the_partitions() -> None:
    exc = errors.StaleMoveToken("m000000000001", 5, 9)
    assert (exc.move_id, exc.token, exc.current) == ("m000000000001", 5, 9)
    assert "token 5 is stale" in exc.message and "token 9" in exc.message
    assert isinstance(exc, errors.MoveRefused)
