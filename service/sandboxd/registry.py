"""What a registry says of a reference before anything is pulled: its digest and its size.

The Docker engine pulls; this asks the registry itself (the distribution API, over aiohttp)
for the manifest, so that `PULL_POLICY_ALWAYS` costs one manifest request when nothing
moved, and `max_image_bytes` is checked from the layer sizes the manifest declares before a
layer is fetched. Credentials come from the operator's file (Docker's config.json `auths`),
never from a caller, and never appear in a message or a log line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from sandboxd.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from sandboxd.reasons import Reason
from sandboxd.settings import is_loopback_host

DOCKER_HUB = "docker.io"
_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
_HUB_API = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}
_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')
# The OCI image spec's digest grammar (algorithm, then an encoded hash of 32 or more).
_DIGEST_RE = re.compile(r"\A[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}\Z")
# RFC 6750's b64token: what a bearer token may be, so nothing else reaches a header.
_TOKEN_RE = re.compile(r"\A[A-Za-z0-9._~+/-]+=*\Z")
_MAX_TOKEN_ANSWER_BYTES = 64 * 1024  # a token service's whole answer (JWTs are a few KiB)


class _Malformed(ValueError):
    """A registry's answer of a shape the distribution API does not give it."""


@dataclass(frozen=True)
class Reference:
    """A reference split the way Docker splits it: registry host, repository, tag or digest."""

    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, ref: str) -> Reference:
        name, _, digest = ref.partition("@")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = DOCKER_HUB, name
        if registry in _HUB_ALIASES:
            registry = DOCKER_HUB
            if "/" not in path.split(":")[0]:
                path = "library/" + path
        last = path.rsplit("/", 1)[-1]
        tag = ""
        if ":" in last:
            path, _, tag = path.rpartition(":")
        if not tag and not digest:
            tag = "latest"
        return cls(registry, path, tag, digest)

    @property
    def name(self) -> str:
        """Registry and repository, as Docker writes it in RepoDigests."""
        if self.registry == DOCKER_HUB:
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"

    def pullable(self) -> str:
        """The fully written reference the engine is asked to pull."""
        host = self.registry
        base = f"{host}/{self.repository}"
        return f"{base}@{self.digest}" if self.digest else f"{base}:{self.tag}"

    def by_digest(self, digest: str) -> str:
        return f"{self.name}@{digest}"

    def is_loopback(self) -> bool:
        host = self.registry.rsplit(":", 1)[0] if not self.registry.endswith("]") else ""
        return is_loopback_host(host.strip("[]") or self.registry)


@dataclass(frozen=True)
class RemoteManifest:
    digest: str
    size_bytes: int | None  # None: the registry's manifest did not say


def load_credentials(path: Path | None) -> dict[str, dict[str, str]]:
    """Docker's config.json `auths`: host -> {username, password}. Errors never quote it."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(
            f"registry_auth_file {path} cannot be read as JSON ({type(exc).__name__})",
            reason=Reason.REGISTRY_UNAUTHORIZED,
        ) from None
    found: dict[str, dict[str, str]] = {}
    for key, entry in (doc.get("auths") or {}).items():
        if not isinstance(entry, dict):
            continue
        user, password = str(entry.get("username", "")), str(entry.get("password", ""))
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
        host = re.sub(r"^https?://", "", str(key)).split("/", 1)[0]
        if host in _HUB_ALIASES or host == "index.docker.io":
            host = DOCKER_HUB
        found[host] = {"username": user, "password": password}
    return found


def _platform_child(index: Mapping[str, Any]) -> str | None:
    """This machine's manifest in an index: a digest in the digest grammar, since it becomes
    the next request's path."""
    arch = _ARCH.get(platform.machine(), platform.machine())
    entries = index.get("manifests") or []
    if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
        raise _Malformed("its index's manifests are not a list of objects")
    for m in entries:
        p = m.get("platform") or {}
        if not isinstance(p, dict):
            raise _Malformed("an index entry's platform is not an object")
        if p.get("os") == "linux" and p.get("architecture") == arch:
            digest = m.get("digest")
            if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
                raise _Malformed("an index entry's digest is not a digest")
            return digest
    return None


def _declared_size(doc: Mapping[str, Any]) -> int | None:
    """The config's and layers' sizes a manifest declares; None when it lists no layers."""
    layers = doc.get("layers")
    if layers is None:
        return None
    config = doc.get("config") or {}
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in [config, *layers]):
        raise _Malformed("its config and layers are not objects")
    return sum(_size(x.get("size")) for x in [config, *layers])


def _size(value: object) -> int:
    """A declared size: a whole number of bytes, not negative (JSON `true` is no size)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Malformed("a size is not a whole number of bytes")
    return value


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The answer's body, or its first `limit` + 1 bytes when it is longer: one read returns
    what has arrived, so a big manifest takes several."""
    body = bytearray()
    while len(body) <= limit and (chunk := await resp.content.read(limit + 1 - len(body))):
        body += chunk
    return bytes(body)


def _object(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise _Malformed("its answer is not a JSON object")
    return doc


class RegistryClient:
    """Manifest requests to registries, with Basic or Bearer (token) authentication."""

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, 10.0))

    async def resolve(self, ref: Reference, auth: Mapping[str, str] | None) -> RemoteManifest:
        """The digest the reference has now, and the image's size where the manifest says."""
        try:
            async with aiohttp.ClientSession(timeout=self._timeout) as http:
                target = ref.digest or ref.tag
                body, media, digest = await self._get(http, ref, target, auth)
                doc = _object(body)
                if media in _INDEX_TYPES or doc.get("manifests"):
                    child = _platform_child(doc)
                    if child is not None:
                        body, _, _ = await self._get(http, ref, child, auth)
                        doc = _object(body)
                return RemoteManifest(digest=digest, size_bytes=_declared_size(doc))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(
                f"registry {ref.registry} does not answer ({type(exc).__name__})",
                reason=Reason.REGISTRY_UNREACHABLE,
                metadata={"registry": ref.registry},
            ) from None
        except ValueError as exc:
            why = str(exc) if isinstance(exc, _Malformed) else "it is not JSON"
            raise Unavailable(
                f"registry {ref.registry} sent a manifest this server cannot read ({why})",
                reason=Reason.REGISTRY_UNREACHABLE,
                metadata={"registry": ref.registry},
            ) from None

    def _url(self, ref: Reference, target: str) -> str:
        scheme = "http" if ref.is_loopback() else "https"
        host = _HUB_API if ref.registry == DOCKER_HUB else ref.registry
        return f"{scheme}://{host}/v2/{ref.repository}/manifests/{target}"

    async def _get(
        self,
        http: aiohttp.ClientSession,
        ref: Reference,
        target: str,
        auth: Mapping[str, str] | None,
    ) -> tuple[bytes, str, str]:
        url = self._url(ref, target)
        headers = {"Accept": MANIFEST_TYPES}
        async with http.get(url, headers=headers, allow_redirects=False) as resp:
            if resp.status == 401:
                challenge = resp.headers.get("WWW-Authenticate", "")
            else:
                return await self._answer(ref, resp)
        headers["Authorization"] = await self._authorization(http, ref, challenge, auth)
        async with http.get(url, headers=headers, allow_redirects=False) as resp:
            return await self._answer(ref, resp)

    async def _authorization(
        self,
        http: aiohttp.ClientSession,
        ref: Reference,
        challenge: str,
        auth: Mapping[str, str] | None,
    ) -> str:
        basic = ""
        if auth:
            pair = f"{auth.get('username', '')}:{auth.get('password', '')}".encode()
            basic = "Basic " + base64.b64encode(pair).decode()
        if challenge.lower().startswith("bearer"):
            params = dict(_CHALLENGE_RE.findall(challenge))
            realm = self._realm(ref, params.pop("realm", ""))
            params.setdefault("scope", f"repository:{ref.repository}:pull")
            token_headers = {"Authorization": basic} if basic else {}
            # Not redirected: a realm's redirect could send the registry's credentials, and the
            # server's own requests, anywhere the registry names next.
            async with http.get(
                realm, params=params, headers=token_headers, allow_redirects=False
            ) as resp:
                answer = await _read_at_most(resp, _MAX_TOKEN_ANSWER_BYTES)
                if resp.status != 200 or len(answer) > _MAX_TOKEN_ANSWER_BYTES:
                    raise self._unauthorized(ref)
            try:
                doc = _object(answer)
            except ValueError:
                raise self._unauthorized(ref) from None
            token = doc.get("token") or doc.get("access_token")
            if not isinstance(token, str) or not _TOKEN_RE.match(token):
                raise self._unauthorized(ref)
            return f"Bearer {token}"
        if not basic:
            raise self._unauthorized(ref)
        return basic

    @staticmethod
    def _realm(ref: Reference, realm: str) -> str:
        """The token service a challenge names: https, or plain http on loopback beside a
        loopback registry (the registry's credentials go there)."""
        try:
            url = urllib.parse.urlsplit(realm)
            host = url.hostname or ""
        except ValueError:  # a bracketed host that is no address, a port out of range
            url, host = urllib.parse.urlsplit(""), ""
        clear_ok = url.scheme == "http" and ref.is_loopback() and is_loopback_host(host)
        if not host or not (url.scheme == "https" or clear_ok):
            raise FailedPrecondition(
                f"registry {ref.registry} named a token service this server does not use "
                f"({realm[:200]!r}: an https URL is needed)",
                reason=Reason.REGISTRY_UNAUTHORIZED,
                metadata={"image": ref.name[:200], "registry": ref.registry},
            )
        return realm

    @staticmethod
    def _unauthorized(ref: Reference) -> FailedPrecondition:
        return FailedPrecondition(
            f"registry {ref.registry} refused this server's credentials for {ref.name} "
            "(operator setting registry_auth_file)",
            reason=Reason.REGISTRY_UNAUTHORIZED,
            metadata={"image": ref.name[:200], "registry": ref.registry},
        )

    async def _answer(self, ref: Reference, resp: aiohttp.ClientResponse) -> tuple[bytes, str, str]:
        if resp.status in (401, 403):
            raise self._unauthorized(ref)
        if resp.status == 404:
            raise NotFound(
                f"image {ref.pullable()!r} is not in its registry (no such repository, tag "
                "or digest)",
                reason=Reason.REGISTRY_IMAGE_NOT_FOUND,
                metadata={"image": ref.pullable()[:200]},
            )
        if resp.status != 200:
            raise Unavailable(
                f"registry {ref.registry} answered HTTP {resp.status}",
                reason=Reason.REGISTRY_UNREACHABLE,
                metadata={"registry": ref.registry},
            )
        body = await _read_at_most(resp, _MAX_MANIFEST_BYTES)
        if len(body) > _MAX_MANIFEST_BYTES:
            raise InvalidArgument(
                f"the manifest of {ref.name!r} is larger than 4 MiB",
                reason=Reason.INVALID_IMAGE,
            )
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        digest = resp.headers.get("Docker-Content-Digest", "")
        if not _DIGEST_RE.match(digest):  # not believed: the body's own hash
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
        return body, media, digest
