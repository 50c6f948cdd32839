#!/usr/bin/env bash
# The registry tests (tests/integration/test_registry.py) run Debian's distribution registry
# (`docker-registry`) on loopback with htpasswd auth (`htpasswd` from apache2-utils). The
# package's own service is stopped and disabled: the tests start a private registry and stop it.
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
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
have
