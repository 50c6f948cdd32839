"""What a sandbox with secrets gets: placeholders in its environment, and the session CA
in a trust bundle its TLS clients read.

The root filesystem is read-only and /workspace enters snapshots, so the bundle lives in a
small tmpfs of its own (`TRUST_DIR`, root-owned, read-only to the sandbox user), written at
create (and again when a restarted server draws a new CA) through the helper, as root. The
bundle is the image's own roots (the first of `IMAGE_ROOTS` found) followed by the session CA.
"""

from __future__ import annotations

from sandboxd.models import NetworkPolicy

TRUST_DIR = "/etc/ssl/sandboxd"
BUNDLE = f"{TRUST_DIR}/ca-bundle.crt"
SESSION_CA = f"{TRUST_DIR}/session-ca.crt"
TRUST_TMPFS_BYTES = 2 * 1024 * 1024
MAX_ROOTS_BYTES = 1024 * 1024
IMAGE_ROOTS = (
    "etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine
    "etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "etc/ssl/cert.pem",  # Alpine, macOS-like layouts
)


def sandbox_env(policy: NetworkPolicy) -> dict[str, str]:
    """Each secret's variable holds its placeholder; the CA variables name the bundle."""
    if not policy.secrets:
        return {}
    env = {b.name: b.placeholder for b in policy.secrets}
    env.update(
        {
            "SSL_CERT_FILE": BUNDLE,
            "REQUESTS_CA_BUNDLE": BUNDLE,
            "CURL_CA_BUNDLE": BUNDLE,
            "NODE_EXTRA_CA_CERTS": SESSION_CA,  # Node adds it to its own roots
        }
    )
    return env


def tmpfs(policy: NetworkPolicy) -> dict[str, str]:
    if not policy.secrets:
        return {}
    return {TRUST_DIR: f"rw,noexec,nosuid,nodev,size={TRUST_TMPFS_BYTES},mode=0755"}
