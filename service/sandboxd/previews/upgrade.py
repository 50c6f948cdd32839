"""When a preview connection may stop being HTTP: an upgrade both ends agreed on.

After a `101 Switching Protocols` the relay copies raw bytes both ways and reads no more
requests on the connection, so nothing after it is routed or checked again. That is sound
only when the client asked for it: a sandbox that answered 101 to a plain request would
otherwise receive the client's next requests, for other previews and with their tokens (a
pooled client, a browser's kept-alive connection). So the tunnel opens only when
- the request asked: `Connection: upgrade` and an `Upgrade` header, no body, and for
  WebSocket a valid handshake (GET, HTTP/1.1, a `Sec-WebSocket-Key` of 16 bytes in base64,
  `Sec-WebSocket-Version: 13`; RFC 6455 section 4.1), else the request is refused (400);
- the sandbox granted it: `101` of HTTP/1.1 to a request of HTTP/1.1 (RFC 9110 7.8 ignores
  a 1.0 request's Upgrade) with `Connection: upgrade`, an `Upgrade` naming a protocol the
  request offered, and for WebSocket the `Sec-WebSocket-Accept` of the request's key
  (section 4.2.2), else the exchange ends with 502 and the client's connection is closed;
- the client sent nothing after the upgrade request before the 101 reached the relay (the
  client waits for it: RFC 6455 4.1, RFC 9113 3.2), else it is a request pipelined behind the
  upgrade, which a tunnel would carry to this sandbox: 400, the connection closed (`relay`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from sandboxd.previews.http1 import NONE, BadMessage, Framing, Head

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def requested(head: Head) -> bool:
    """Whether the request asks to switch protocols."""
    return "upgrade" in head.tokens("connection") and head.get("upgrade") is not None


def check_request(head: Head, framing: Framing) -> None:
    """BadMessage unless an upgrade request is one the relay may tunnel after a 101."""
    if not requested(head):
        return
    if framing != NONE:
        raise BadMessage("an upgrade request has no body")
    if "websocket" not in head.tokens("upgrade"):
        return
    if head.method != "GET" or head.version != "HTTP/1.1":
        raise BadMessage("a WebSocket handshake is a GET of HTTP/1.1")
    if _key(head) is None:
        raise BadMessage("invalid Sec-WebSocket-Key")
    if head.count("sec-websocket-version") != 1 or head.get("sec-websocket-version") != "13":
        raise BadMessage("unsupported Sec-WebSocket-Version (13 is)")


def _key(head: Head) -> str | None:
    if head.count("sec-websocket-key") != 1:
        return None
    key = (head.get("sec-websocket-key") or "").strip()
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(raw) == 16 else None


def accept_of(key: str) -> str:
    """The `Sec-WebSocket-Accept` that answers `key`."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _WS_GUID).digest()).decode()


def granted(request: Head, answer: Head) -> bool:
    """Whether a 101 answers the upgrade `request` asked for (and it asked for one)."""
    if not requested(request) or "upgrade" not in answer.tokens("connection"):
        return False
    if request.version != "HTTP/1.1" or answer.version != "HTTP/1.1":
        return False  # RFC 9110 7.8: an HTTP/1.0 request's Upgrade is ignored
    offered = request.tokens("upgrade")
    chosen = answer.tokens("upgrade")
    if len(chosen) != 1 or not chosen <= offered:
        return False
    if chosen == {"websocket"}:
        key = _key(request)
        return key is not None and answer.get("sec-websocket-accept") == accept_of(key)
    return True
