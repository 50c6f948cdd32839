"""A registry's answers are a stranger's: whatever shape a manifest, an index, a token answer or
a challenge has, a pull is refused with the registry's reason (UNAVAILABLE
REGISTRY_UNREACHABLE or FAILED_PRECONDITION REGISTRY_UNAUTHORIZED), never an internal error,
and the server reads no more of an answer than it bounds. The registry is an aiohttp server
on loopback that answers what each test says."""

from __future__ import annotations

import json
import platform
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from sandboxd.errors import FailedPrecondition, SandboxError, Unavailable
from sandboxd.reasons import Reason
from sandboxd.registry import Reference, RegistryClient

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
GOOD_DIGEST = "sha256:" + "a" * 64

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def registry() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Reference, list[str]]]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> tuple[Reference, list[str]]:
        seen: list[str] = []

        async def record(request: web.Request) -> web.StreamResponse:
            seen.append(request.path_qs)
            return await handler(request)

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", record)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return Reference.parse(f"127.0.0.1:{port}/hostile/img:1"), seen

    yield start
    for runner in runners:
        await runner.cleanup()


def _answer(body: Any, media: str = MANIFEST) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return web.Response(body=raw, headers={"Content-Type": media})

    return handler


def _layers(*sizes: Any) -> dict[str, Any]:
    return {"config": {"size": 10}, "layers": [{"size": s} for s in sizes]}


BAD_MANIFESTS = [
    pytest.param([1], id="a list"),
    pytest.param("text", id="a string"),
    pytest.param({"layers": 5}, id="layers a number"),
    pytest.param({"layers": [1]}, id="a layer a number"),
    pytest.param(_layers("12"), id="a size as text"),
    pytest.param(_layers(-(2**40)), id="a negative size"),
    pytest.param(_layers(True), id="a size true"),
    pytest.param(_layers(1.5), id="a fractional size"),
    pytest.param(b'{"layers": [{"size": 1e400}]}', id="an infinite size"),
    pytest.param({"config": [1], "layers": []}, id="config a list"),
    pytest.param({"config": {"size": "x"}, "layers": []}, id="config size as text"),
]


@pytest.mark.parametrize("manifest", BAD_MANIFESTS)
async def test_a_manifest_of_another_shape_is_the_registrys_fault(registry, manifest) -> None:  # type: ignore[no-untyped-def]
    ref, _ = await registry(_answer(manifest))
    with pytest.raises(Unavailable) as err:
        await RegistryClient(timeout_s=5).resolve(ref, None)
    assert err.value.reason == Reason.REGISTRY_UNREACHABLE


BAD_INDEXES = [
    pytest.param({"manifests": [1]}, id="an entry a number"),
    pytest.param({"manifests": 7}, id="manifests a number"),
    pytest.param({"manifests": [{"platform": "linux"}]}, id="platform a string"),
    pytest.param(
        {"manifests": [{"platform": {"os": "linux", "architecture": ARCH}, "digest": "../x"}]},
        id="a child digest that is a path",
    ),
    pytest.param(
        {"manifests": [{"platform": {"os": "linux", "architecture": ARCH}, "digest": 5}]},
        id="a child digest that is a number",
    ),
]


@pytest.mark.parametrize("index", BAD_INDEXES)
async def test_an_index_of_another_shape_is_the_registrys_fault(registry, index) -> None:  # type: ignore[no-untyped-def]
    ref, seen = await registry(_answer(index, INDEX))
    with pytest.raises(Unavailable) as err:
        await RegistryClient(timeout_s=5).resolve(ref, None)
    assert err.value.reason == Reason.REGISTRY_UNREACHABLE
    assert len(seen) == 1  # no second request built from what the index said


async def test_a_well_formed_manifest_is_sized(registry) -> None:  # type: ignore[no-untyped-def]
    """The control: the same client reads a manifest of the expected shape."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = json.dumps(_layers(100, 200)).encode()
        return web.Response(
            body=body, headers={"Content-Type": MANIFEST, "Docker-Content-Digest": GOOD_DIGEST}
        )

    ref, _ = await registry(handler)
    got = await RegistryClient(timeout_s=5).resolve(ref, None)
    assert got.size_bytes == 310 and got.digest == GOOD_DIGEST


async def test_a_digest_header_not_in_the_digest_grammar_is_not_believed(registry) -> None:  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=json.dumps(_layers(1)).encode(),
            headers={"Content-Type": MANIFEST, "Docker-Content-Digest": "sha256:../../zz"},
        )

    ref, _ = await registry(handler)
    got = await RegistryClient(timeout_s=5).resolve(ref, None)
    assert got.digest.startswith("sha256:") and len(got.digest) == 71  # the body's own hash


def _challenge(realm: str) -> web.Response:
    return web.Response(
        status=401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="r"'}
    )


def _behind_tokens(token_service: Handler) -> Handler:
    """A registry that challenges for a bearer token from its own `/token` (answered by
    `token_service`) and serves a manifest to any request that carries one."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v2/"):
            if "Authorization" in request.headers:
                return web.Response(body=json.dumps(_layers(1)).encode(), content_type=MANIFEST)
            return _challenge(f"http://{request.host}/token")
        return await token_service(request)

    return handler


@pytest.mark.parametrize(
    "token_answer",
    [
        pytest.param(b"[1]", id="a list"),
        pytest.param(b'{"token": 5}', id="a token that is a number"),
        pytest.param(b'{"token": "a\\r\\nX-Injected: 1"}', id="a token with a line break"),
        pytest.param(b'{"token": "' + b"t" * 70_000 + b'"}', id="an oversized answer"),
    ],
)
async def test_a_token_answer_of_another_shape_is_refused_credentials(  # type: ignore[no-untyped-def]
    registry, token_answer: bytes
) -> None:
    async def tokens(request: web.Request) -> web.StreamResponse:
        return web.Response(body=token_answer, headers={"Content-Type": "application/json"})

    ref, _ = await registry(_behind_tokens(tokens))
    with pytest.raises(FailedPrecondition) as err:
        await RegistryClient(timeout_s=5).resolve(ref, None)
    assert err.value.reason == Reason.REGISTRY_UNAUTHORIZED


async def test_the_token_realm_is_not_followed_through_a_redirect(registry) -> None:  # type: ignore[no-untyped-def]
    """A realm that redirects would send the server anywhere the registry names next (the
    host's own network included): the redirect is refused, its target never asked."""

    async def tokens(request: web.Request) -> web.StreamResponse:
        if request.path == "/token":
            raise web.HTTPFound(f"http://{request.host}/elsewhere")
        return web.Response(body=b'{"token": "t"}', content_type="application/json")

    ref, seen = await registry(_behind_tokens(tokens))
    with pytest.raises(FailedPrecondition) as err:
        await RegistryClient(timeout_s=5).resolve(ref, None)
    assert err.value.reason == Reason.REGISTRY_UNAUTHORIZED
    assert not any(p.startswith("/elsewhere") for p in seen)


@pytest.mark.parametrize(
    "realm",
    [
        pytest.param("file:///etc/passwd", id="a file url"),
        pytest.param("ftp://127.0.0.1/token", id="another scheme"),
        pytest.param("/token", id="a relative url"),
        # In the clear to a host that is not loopback (0.0.0.0 is not; Linux connects it to
        # this machine, so a red run stays here): the registry's credentials would travel in
        # plain text. A realm is https, or http on loopback beside a loopback registry.
        pytest.param("http://0.0.0.0:9/token", id="plain http off loopback"),
    ],
)
async def test_a_realm_that_is_no_http_url_is_refused(registry, realm: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        return _challenge(realm)

    ref, _ = await registry(handler)
    with pytest.raises(SandboxError) as err:
        await RegistryClient(timeout_s=5).resolve(ref, None)
    assert err.value.reason == Reason.REGISTRY_UNAUTHORIZED


async def test_a_manifest_larger_than_one_read_is_read_whole(registry) -> None:  # type: ignore[no-untyped-def]
    """A big index or manifest arrives in several reads of the socket; all of it is parsed (a
    read of "up to" the limit returns what has arrived, not what was sent)."""
    sizes = list(range(1, 20_001))
    ref, _ = await registry(_answer(_layers(*sizes)))
    got = await RegistryClient(timeout_s=5).resolve(ref, None)
    assert got.size_bytes == 10 + sum(sizes)
