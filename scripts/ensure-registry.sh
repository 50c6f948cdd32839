#!/usr/bin/env bash
# The registry tests (tests/integration/test_registry.py) run Debian's distribution registry
# (`docker-registry`) on loopback with htpasswd auth (`htpasswd` from apache2-utils). The
# package's own service is kept from starting and disabled: the tests start a private registry
# on loopback and stop it. (The package adds /etc/docker/registry/config.yml, unused here.)
set -euo pipefail
have() { command -v docker-registry >/dev/null 2>&1 && command -v htpasswd >/dev/null 2>&1; }
if have; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-registry: docker-registry and apache2-utils (Debian) are needed for the registry tests" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# No service of its own may start on install (it would listen on :5000 for everyone).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; made_policy=1; fi
trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends docker-registry apache2-utils >/dev/null
# Nor at boot: Debian's default config listens on :5000 on every interface, without auth.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1; then
  update-rc.d docker-registry disable >/dev/null 2>&1 || true
fi
have
