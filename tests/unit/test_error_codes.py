"""Each error class declares its gRPC code once; both directions of the mapping follow."""

from __future__ import annotations

import grpc
import pytest

from chronoq import errors
from chronoq.client.remote import translate
from chronoq.node.edge.status import code_for


def _subclasses(cls: type[errors.ChronoqError]) -> list[type[errors.ChronoqError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_subclasses(sub))
    return found


DOMAIN = [c for c in _subclasses(errors.ChronoqError) if not issubclass(c, errors.RemoteError)]
REMOTE = _subclasses(errors.RemoteError)[1:]


@pytest.mark.parametrize("cls", DOMAIN, ids=lambda c: c.__name__)
def test_every_declared_code_is_a_grpc_status(cls: type[errors.ChronoqError]) -> None:
    assert cls.grpc_code in grpc.StatusCode.__members__


@pytest.mark.parametrize("cls", DOMAIN, ids=lambda c: c.__name__)
def test_a_client_raises_a_specific_class_for_every_code_a_node_sends(
    cls: type[errors.ChronoqError],
) -> None:
    if cls.grpc_code == errors.INTERNAL:
        assert errors.remote_error_class(cls.grpc_code) is errors.RemoteError
    else:
        assert errors.remote_error_class(cls.grpc_code) is not errors.RemoteError


def test_the_server_answers_what_the_class_declares() -> None:
    assert code_for(errors.TaskNotFound("t")) is grpc.StatusCode.NOT_FOUND
    assert code_for(errors.NamespaceDenied("ns")) is grpc.StatusCode.PERMISSION_DENIED
    assert code_for(errors.StoreUnavailable()) is grpc.StatusCode.UNAVAILABLE
    assert code_for(errors.ChronoqError()) is grpc.StatusCode.INTERNAL


@pytest.mark.parametrize("cls", REMOTE, ids=lambda c: c.__name__)
def test_remote_classes_round_trip(cls: type[errors.RemoteError]) -> None:
    assert cls.grpc_codes and cls.code == cls.grpc_codes[0]
    assert cls("x").code == cls.grpc_codes[0]
    for name in cls.grpc_codes:
        assert name in grpc.StatusCode.__members__
        assert errors.remote_error_class(name) is cls


class _Rpc(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="why")


@pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda c: c.name)
def test_translate(code: grpc.StatusCode) -> None:
    exc = translate(_Rpc(code))
    assert type(exc) is errors.remote_error_class(code.name)
    assert exc.code == code.name and exc.message == f"{code.name}: why"


def test_a_code_is_declared_by_one_class() -> None:
    with pytest.raises(TypeError, match="already"):
        type("Again", (errors.RemoteError,), {"grpc_codes": ("NOT_FOUND",)})
