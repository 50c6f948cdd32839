"""The Python client's error classes: one per ErrorReason, named after it as Node's and Go's
are, each under its family so that the family's `except` keeps catching it."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from sandboxd_client import errors
from sandboxd_client._gen import reasons
from sandboxd_client._gen.sandboxd.v1 import errors_pb2


def _failed(code: grpc.StatusCode, reason: str, message: str = "refused") -> grpc.aio.AioRpcError:
    """The RpcError a call ends with when the server refuses it with `reason`."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="sandboxd"))
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details=message)


def _pascal(reason: str) -> str:
    return "".join(part.capitalize() for part in reason.split("_"))


def test_file_too_large_is_its_own_class_and_still_space_exhausted() -> None:
    err = errors.from_rpc_error(_failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "FILE_TOO_LARGE"))
    assert type(err) is errors.FileTooLarge
    assert isinstance(err, errors.SpaceExhausted) and isinstance(err, errors.ResourceExhausted)
    assert err.reason == "FILE_TOO_LARGE" and err.message == "refused"
    with pytest.raises(errors.SpaceExhausted):  # an existing `except` clause still catches it
        raise err


def test_every_reason_has_a_class_named_after_it_under_its_code() -> None:
    proto = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()}
    assert set(errors.BY_REASON) == proto - {"UNSPECIFIED"}
    for reason, code in reasons.CODE.items():
        cls = getattr(errors, _pascal(reason))
        assert errors.BY_REASON[reason] is cls, reason
        assert cls.code.name == code, reason
        assert issubclass(cls, errors.BY_CODE[grpc.StatusCode[code]]), reason
        err = errors.from_rpc_error(_failed(grpc.StatusCode[code], reason))
        assert type(err) is cls and err.reason == reason


@pytest.mark.parametrize(
    ("reason", "family"),
    [
        ("WORKSPACE_FULL", errors.SpaceExhausted),
        ("LEASE_EXPIRED", errors.SessionNotRunning),
        ("CONTAINER_REBUILDING", errors.EngineUnavailable),
        ("TENANT_EXEC_QUOTA", errors.QuotaExceeded),
        ("ARCHIVE_PATH_TRAVERSAL", errors.ArchiveRejected),
        ("PATH_OUTSIDE_WORKSPACE", errors.PathError),
    ],
)
def test_a_reason_class_subclasses_its_family(reason: str, family: type) -> None:
    cls = errors.BY_REASON[reason]
    assert cls is not family and issubclass(cls, family)


def test_a_reason_sent_with_another_code_falls_back_to_that_codes_class() -> None:
    err = errors.from_rpc_error(_failed(grpc.StatusCode.INTERNAL, "FILE_TOO_LARGE"))
    assert type(err) is errors.Internal and err.reason == "FILE_TOO_LARGE"
