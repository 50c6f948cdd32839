"""Preview tokens, routing, credentials and the access decision (previews/tokens.py,
access.py), and the per-session limits (connections.py): pure logic, no Docker."""

from __future__ import annotations

import asyncio
import base64
import json
import stat
import time
from pathlib import Path

import pytest
from sandboxd.previews import access
from sandboxd.previews.connections import OpenConnections, OverLimit
from sandboxd.previews.http1 import Head
from sandboxd.previews.registry import Publication
from sandboxd.previews.tokens import Claims, TokenSigner, load_key

KEY = b"k" * 32
NOW = 1_800_000_000.0


def _pub(**kw: object) -> Publication:
    fields: dict[str, object] = {
        "session_id": "alice.s-1",
        "port": 8080,
        "tenant": "alice",
        "generation": 7,
        "public": False,
        "expires_at": NOW + 60,
    }
    fields.update(kw)
    return Publication(**fields)  # type: ignore[arg-type]


def _token(pub: Publication, signer: TokenSigner | None = None, **kw: object) -> str:
    claims = Claims(pub.session_id, pub.port, pub.tenant, pub.generation, pub.expires_at)
    claims = Claims(**{**claims.__dict__, **kw})  # type: ignore[arg-type]
    return (signer or TokenSigner(KEY)).sign(claims)


def _target(path_routed: bool = True) -> access.Target:
    return access.Target("alice.s-1", 8080, path_routed, "/")


def _check(pub: Publication | None, *tokens: str) -> access.Refusal | str | None:
    creds = access.Credentials(tuple(tokens), "")
    return access.check(TokenSigner(KEY), pub, _target(), creds, now=NOW)


def test_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    key = load_key(tmp_path)
    path = tmp_path / "preview-key"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(tmp_path) == key  # a restart signs and checks with the same key


def test_a_valid_token_opens_and_public_needs_none() -> None:
    pub = _pub()
    token = _token(pub)
    assert _check(pub, token) == token
    assert _check(_pub(public=True)) is None


@pytest.mark.parametrize(
    ("kw", "status", "why"),
    [
        ({"expires_at": NOW - 1}, 401, "token_expired"),
        ({"generation": 6}, 401, "token_revoked"),
        ({"tenant": "bob"}, 403, "token_other_tenant"),
        ({"port": 8081}, 403, "token_other_preview"),
        ({"session_id": "alice.s-2"}, 403, "token_other_preview"),
    ],
)
def test_refusals(kw: dict[str, object], status: int, why: str) -> None:
    r = _check(_pub(), _token(_pub(), **kw))
    assert isinstance(r, access.Refusal) and (r.status, r.why) == (status, why)


def test_forged_tokens() -> None:
    pub = _pub()
    good = _token(pub)
    body, mac = good.split(".")
    doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    doc[4] += 3600  # a longer life under the old MAC
    edited = base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=") + "." + mac
    other_key = _token(pub, TokenSigner(b"x" * 32))
    for token in (edited, other_key, good + "x", "a.b", "...", "x" * 5000, body):
        r = _check(pub, token)
        assert isinstance(r, access.Refusal) and (r.status, r.why) == (401, "token_forged"), token


def test_missing_token_and_unpublished_port() -> None:
    r = _check(_pub())
    assert isinstance(r, access.Refusal) and (r.status, r.why) == (401, "token_missing")
    r = _check(None, _token(_pub()))
    assert isinstance(r, access.Refusal) and (r.status, r.why) == (404, "not_published")


def test_any_carried_token_that_opens_will_do() -> None:
    pub = _pub()
    assert _check(pub, "stale", _token(pub)) == _token(pub)
    r = _check(pub, "garbage", _token(pub, generation=1))
    assert isinstance(r, access.Refusal) and r.why == "token_revoked"  # the telling refusal


def test_routes() -> None:
    def route(host: str, target: str) -> access.Target | None:
        return access.route(Head("GET / HTTP/1.1", [("Host", host)]), target, "p.example")

    assert route("8080-alice.s-1.p.example:8443", "/a?b") == access.Target(
        "alice.s-1", 8080, False, "/a?b"
    )
    assert route("x", "/preview/s-1/3000/a/b?c=d") == access.Target("s-1", 3000, True, "/a/b?c=d")
    assert route("x", "/preview/s-1/3000") == access.Target("s-1", 3000, True, "/")
    for host, target in (
        ("0-s.p.example", "/"),
        ("70000-s.p.example", "/"),
        ("8080-s.other.example", "/"),
        ("x", "/preview/s-1/0/"),
        ("x", "/preview/s-1/x/"),
        ("x", "/elsewhere"),
        ("8080-s.p.example", "http://evil/"),  # absolute-form is not a preview request
    ):
        assert route(host, target) is None, (host, target)


def test_credentials_are_taken_out_and_the_rest_kept_byte_for_byte() -> None:
    head = Head(
        "GET / HTTP/1.1",
        [
            ("Host", "x"),
            ("X-Sandboxd-Token", "hdr"),
            ("Cookie", "a=1; sandboxd_preview=ck; b=2"),
            ("Cookie", "sandboxd_preview=ck2"),
        ],
    )
    target = access.Target("s", 80, True, "/p?x=%20y&sandboxd_token=q&flag&z=1+2")
    creds, stripped = access.take_credentials(head, target)
    assert creds.tokens == ("hdr", "q", "ck", "ck2") and creds.from_query == "q"
    assert stripped.rest == "/p?x=%20y&flag&z=1+2"
    assert head.headers == [("Host", "x"), ("Cookie", "a=1; b=2")]
    head = Head("GET / HTTP/1.1", [("Cookie", "sandboxd_preview=only")])
    creds, stripped = access.take_credentials(
        head, access.Target("s", 80, True, "/?sandboxd_token=q")
    )
    assert head.headers == [] and stripped.rest == "/"


def test_cookie_is_scoped_to_the_preview() -> None:
    path = access.cookie_header("tok", _target(True), time.time() + 100, secure=True)
    assert "Path=/preview/alice.s-1/8080/" in path and "Secure" in path and "HttpOnly" in path
    assert "Domain" not in path and "SameSite=Lax" in path
    host = access.cookie_header("tok", _target(False), time.time() + 100, secure=False)
    assert "Path=/;" in host + ";" and "Secure" not in host


async def test_connection_and_byte_limits() -> None:
    conns = OpenConnections(max_connections=2, max_bytes=1000)
    with conns.hold("s", 80, 1) as a, conns.hold("s", 81, 1):
        with pytest.raises(OverLimit), conns.hold("s", 80, 1):
            pass
        with conns.hold("t", 80, 1):  # another session has its own count
            pass
        conns.count_bytes(a, 999)
        with pytest.raises(OverLimit):
            conns.count_bytes(a, 1)
    assert conns.count("s") == 0
    with pytest.raises(OverLimit), conns.hold("s", 80, 1):  # the quota is spent
        pass
    conns.forget("s")
    with conns.hold("s", 80, 1):
        pass


async def test_cut_cancels_the_connections_of_that_preview_only() -> None:
    conns = OpenConnections()
    started = asyncio.Event()

    async def hold(port: int, generation: int) -> None:
        with conns.hold("s", port, generation):
            started.set()
            await asyncio.sleep(60)

    old = asyncio.create_task(hold(80, 1))
    new = asyncio.create_task(hold(80, 2))
    other = asyncio.create_task(hold(81, 1))
    await asyncio.sleep(0)
    assert conns.cut("s", 80, keep_generation=2) == 1  # a new PublishPort: the old token's
    await asyncio.sleep(0)
    assert old.cancelled() and not new.done() and not other.done()
    assert conns.cut("s") == 2  # the session ended
    await asyncio.gather(new, other, return_exceptions=True)
    assert new.cancelled() and other.cancelled() and conns.count("s") == 0
