"""ErrorInfo metadata in both key styles and RetryInfo on retryable reasons (api/errors.py via
api/error_details.py), checked on the status the server sends."""

from __future__ import annotations

import pytest
from google.rpc import error_details_pb2, status_pb2
from sandboxd import errors
from sandboxd.api import error_details
from sandboxd.api.errors import to_status
from sandboxd.reasons import Reason
from sandboxd.tools.genproto import reason_docs
from sandboxd.validation import validate_session_id
from sandboxd.validation.commands import check_command_allowed


def _details(exc: errors.SandboxError) -> list[object]:
    """The details of the status the server would send, unpacked."""
    status = to_status(exc)
    (raw,) = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    out: list[object] = []
    for any_ in status_pb2.Status.FromString(raw).details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo):
            if any_.Is(cls.DESCRIPTOR):
                msg = cls()
                any_.Unpack(msg)
                out.append(msg)
    return out


def test_retryable_set_is_what_errors_proto_marks() -> None:
    assert {str(r) for r in error_details.RETRYABLE} == {
        d.name for d in reason_docs() if d.retryable
    }


def test_metadata_keys_are_sent_once_in_lower_camel_case_with_units_in_the_key() -> None:
    exc = errors.InvalidArgument(
        "too long",
        reason=Reason.LIMIT_EXCEEDS_MAXIMUM,
        metadata={"limit": "timeout", "maximum": "600s", "process_id": "p-1", "path": "a"},
    )
    (info,) = _details(exc)
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert dict(info.metadata) == {
        "limit": "timeout",
        "maximumSeconds": "600",
        "processId": "p-1",
        "path": "a",
    }


def test_metadata_values_are_the_callers_values_not_quoted() -> None:
    """A program reads ErrorInfo metadata: the command is `cat`, not `'cat'`."""

    with pytest.raises(errors.InvalidArgument) as invalid:
        validate_session_id("Bad Id")
    (info,) = _details(invalid.value)
    assert dict(info.metadata) == {"sessionId": "Bad Id"}
    with pytest.raises(errors.PermissionDenied) as refused:
        check_command_allowed("cat", allow=frozenset({"ls"}), allow_all=False)
    (info,) = _details(refused.value)
    assert dict(info.metadata) == {"command": "cat"}


def test_retryable_reasons_carry_retry_info_and_others_do_not() -> None:
    details = _details(errors.EngineUnavailable("down"))
    assert [type(d).__name__ for d in details] == ["ErrorInfo", "RetryInfo"]
    retry = details[1]
    assert isinstance(retry, error_details_pb2.RetryInfo)
    assert retry.retry_delay.seconds == error_details.RETRY_DELAY_S
    plain = _details(errors.NotFound("gone", reason=Reason.FILE_NOT_FOUND))
    assert [type(d).__name__ for d in plain] == ["ErrorInfo"]


def test_camel() -> None:
    assert error_details.camel("max_output_bytes") == "maxOutputBytes"
    assert error_details.camel("limit") == "limit"
