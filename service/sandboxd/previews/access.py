"""Who may open a preview: where a request is going, and whether its token lets it in.

Pure decisions over the registry's answer, so every refusal has one place and one status:
  404  not a preview address, or the port is not published (never published, unpublished,
       or its session ended: the registry forgets a session's ports when it ends)
  401  no token, a token this server did not sign (forged, edited), an expired one, or one
       revoked by a later PublishPort of the same port (`X-Sandboxd-Refusal` says which)
  403  a genuine token for another port, another session or another tenant
The token comes from header `X-Sandboxd-Token`, query parameter `sandboxd_token` (the answer
then sets a cookie scoped to this preview, so a browser needs the link only once), or that
cookie. All three are removed before the request reaches the sandbox.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from urllib.parse import unquote_plus

from sandboxd.previews.http1 import Head
from sandboxd.previews.registry import Publication
from sandboxd.previews.tokens import TokenSigner

TOKEN_HEADER = "X-Sandboxd-Token"
TOKEN_QUERY = "sandboxd_token"
COOKIE = "sandboxd_preview"
PATH_PREFIX = "/preview/"
_HOST = re.compile(r"^([0-9]{1,5})-(.+)$")
_PATH = re.compile(r"^/preview/([^/?#]+)/([0-9]{1,5})(/[^?#]*)?(\?.*)?$")


@dataclass(frozen=True)
class Target:
    session_id: str
    port: int
    path_routed: bool
    rest: str  # the request target the sandbox sees (path and query)

    @property
    def cookie_path(self) -> str:
        return f"{PATH_PREFIX}{self.session_id}/{self.port}/" if self.path_routed else "/"


def route(head: Head, target: str, domain: str) -> Target | None:
    """Host `<port>-<session>.<domain>`, else path `/preview/<session>/<port>/...`."""
    host = (head.get("host") or "").strip().lower()
    host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if domain and host.endswith("." + domain.lower()):
        m = _HOST.match(host[: -len(domain) - 1])
        if m and 1 <= int(m.group(1)) <= 65535 and target.startswith("/"):
            return Target(m.group(2), int(m.group(1)), False, target)
    m = _PATH.match(target)
    if m and 1 <= int(m.group(2)) <= 65535:
        return Target(m.group(1), int(m.group(2)), True, (m.group(3) or "/") + (m.group(4) or ""))
    return None


@dataclass(frozen=True)
class Refusal:
    status: int
    why: str  # machine-readable, in X-Sandboxd-Refusal
    message: str


@dataclass(frozen=True)
class Credentials:
    """The tokens a request carries, and the request stripped of them."""

    tokens: tuple[str, ...]
    from_query: str  # the query's token, to be set as the cookie if it is the one that opens


def take_credentials(head: Head, target: Target) -> tuple[Credentials, Target]:
    """Remove the token header, query parameter and cookie; return what they held."""
    found: list[str] = []
    header = head.get(TOKEN_HEADER)
    head.remove(TOKEN_HEADER)
    if header:
        found.append(header.strip())
    rest, from_query = target.rest, ""
    path, q, query = rest.partition("?")
    if q:
        # Split by hand: the other parameters reach the sandbox byte for byte as sent.
        parts = query.split("&")
        kept = [p for p in parts if unquote_plus(p.partition("=")[0]) != TOKEN_QUERY]
        if len(kept) != len(parts):
            raw = next(p for p in parts if unquote_plus(p.partition("=")[0]) == TOKEN_QUERY)
            from_query = unquote_plus(raw.partition("=")[2])
            found.append(from_query)
            rest = path + ("?" + "&".join(kept) if kept else "")
    cookies = [v for k, v in head.headers if k.lower() == "cookie"]
    if cookies:
        head.remove("cookie")
        kept_parts = []
        for line in cookies:
            for part in line.split(";"):
                name, eq, value = part.strip().partition("=")
                if eq and name == COOKIE:
                    found.append(value.strip())
                elif part.strip():
                    kept_parts.append(part.strip())
        if kept_parts:
            head.headers.append(("Cookie", "; ".join(kept_parts)))
    stripped = Target(target.session_id, target.port, target.path_routed, rest)
    return Credentials(tuple(found), from_query), stripped


def check(
    signer: TokenSigner,
    pub: Publication | None,
    target: Target,
    creds: Credentials,
    now: float | None = None,
) -> Refusal | str | None:
    """None or the opening token when the request may pass; else the refusal."""
    if pub is None:
        return Refusal(404, "not_published", f"port {target.port} is not published")
    if pub.public:
        return None
    if not creds.tokens:
        return Refusal(401, "token_missing", f"send the preview token in {TOKEN_HEADER}")
    now = time.time() if now is None else now
    worst: Refusal | None = None
    for token in creds.tokens:  # any one that opens will do (e.g. a stale cookie and a header)
        refusal = _judge(signer, pub, target, token, now)
        if refusal is None:
            return token
        if worst is None or _rank(refusal) > _rank(worst):
            worst = refusal
    assert worst is not None
    return worst


def _rank(r: Refusal) -> int:
    return {"token_forged": 0, "token_expired": 2, "token_revoked": 3}.get(r.why, 1)


def _judge(
    signer: TokenSigner, pub: Publication, target: Target, token: str, now: float
) -> Refusal | None:
    claims = signer.verify(token)
    if claims is None:
        return Refusal(401, "token_forged", "the token is not one this server issued")
    if claims.tenant != pub.tenant:
        return Refusal(403, "token_other_tenant", "the token belongs to another tenant")
    if (claims.session_id, claims.port) != (target.session_id, target.port):
        return Refusal(403, "token_other_preview", "the token opens another preview")
    if claims.generation != pub.generation:
        return Refusal(401, "token_revoked", "the token was revoked (the port was published again)")
    if claims.expires_at <= now:
        return Refusal(401, "token_expired", "the token expired; publish the port again")
    return None


def cookie_header(token: str, target: Target, expires_at: float, secure: bool) -> str:
    """Set-Cookie for the opening query token: host-only, this preview's path, HttpOnly."""
    cookie: SimpleCookie = SimpleCookie()
    try:
        cookie[COOKIE] = token
    except CookieError:  # pragma: no cover - tokens are base64url and '.'
        return ""
    morsel = cookie[COOKIE]
    morsel["path"] = target.cookie_path
    morsel["max-age"] = str(max(0, int(expires_at - time.time())))
    morsel["httponly"] = True
    morsel["samesite"] = "Lax"
    if secure:
        morsel["secure"] = True
    return morsel.OutputString()
