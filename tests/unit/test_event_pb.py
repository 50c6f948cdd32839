"""Output events are built in place (no submessage merge): the bytes on the wire must be those
of the keyword form, with `output` set even when every field of it is at its default."""

from __future__ import annotations

import pytest
from sandboxd.api.process_service import _event_pb
from sandboxd.models import ExecOutput, OutputStream
from sandboxd.v1 import process_pb2

CLASSES = (
    process_pb2.ExecResponse,
    process_pb2.InteractResponse,
    process_pb2.AttachProcessResponse,
)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("stream", list(OutputStream))
@pytest.mark.parametrize(("data", "offset"), [(b"", 0), (b"abc", 7), (bytes(range(256)) * 256, 9)])
def test_output_reply_is_the_keyword_form(
    cls: type, stream: OutputStream, data: bytes, offset: int
) -> None:
    built = _event_pb(ExecOutput(stream, data, offset), cls)
    expected = cls(output=process_pb2.ProcessOutput(stream=stream.value, data=data, offset=offset))
    assert built.SerializeToString() == expected.SerializeToString()
    assert built.HasField("output")
    assert built.output.data == data
