#!/usr/bin/env bash
# `make gvisor`: make gVisor's runsc available to the Docker engine as the runtime "runsc".
# Idempotent. On a machine where it cannot be had (not root, no apt, a remote engine) it says why
# and exits 0, so `make test` still runs and the gVisor half of the suite skips with that reason.
#
# - Installs Debian's `runsc` package.
# - Registers it by MERGING a runtime entry into /etc/docker/daemon.json: whatever the operator
#   has there is kept, byte for byte where untouched (a copy is left in daemon.json.sandboxd-bak).
# - Reloads the engine with SIGHUP (runtimes are a reloadable setting): never a restart, so the
#   operator's running containers are untouched.
# Flags: Debian 12's runsc starts here only with --network=none (its netstack refuses to start
# in this kind of VM) and the KVM platform hangs, so the default platform is kept.
set -euo pipefail

runtime=${SANDBOXD_GVISOR_RUNTIME:-runsc}
config=${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}

has_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$runtime\""; }
skip() { echo "ensure-gvisor: $*; sessions can use only the runc tier here" >&2; exit 0; }
# Memory suspends (checkpoints of gVisor sessions) need the engine in experimental mode, which
# only a restart of dockerd sets: never done here (it would stop the host's containers). An
# engine ensure-docker.sh started has it; for any other this says how, and the suite's memory
# suspend tests run on a private engine of their own (tests/checkpoint_engine.py).
experimental() {
  [ "$(docker info --format '{{.ExperimentalBuild}}' 2>/dev/null)" = true ] && return
  echo "ensure-gvisor: the engine is not in experimental mode, so memory suspends are off" \
    "(GetServerInfo lacks memory_suspend). To have them: add \"experimental\": true to" \
    "$config and restart dockerd when its containers may stop." >&2
}
trap 'experimental' EXIT

if has_runtime; then exit 0; fi
[ "$(id -u)" = 0 ] || skip "not root"
[ -z "${DOCKER_HOST:-}" ] || skip "the engine is remote (DOCKER_HOST=$DOCKER_HOST); register runsc there"
command -v runsc >/dev/null 2>&1 || {
  command -v apt-get >/dev/null 2>&1 || skip "no apt-get to install runsc"
  echo "ensure-gvisor: installing runsc from Debian's packages" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null || skip "apt-get could not install runsc"
}
path=$(command -v runsc)

mkdir -p "$(dirname "$config")"
[ -f "$config" ] && cp -p "$config" "$config.sandboxd-bak"
python3 - "$config" "$runtime" "$path" <<'EOF'
import json, os, sys
config, runtime, path = sys.argv[1:]
try:
    with open(config) as f:
        text = f.read()
    data = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    data = {}
if not isinstance(data, dict):
    sys.exit(f"ensure-gvisor: {config} is not a JSON object; not touching it")
data.setdefault("runtimes", {})[runtime] = {"path": path, "runtimeArgs": ["--network=none"]}
tmp = config + ".tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
os.replace(tmp, config)
EOF

pid=$(pidof dockerd || true)
[ -n "$pid" ] || skip "no local dockerd process to reload"
kill -HUP $pid
for _ in $(seq 1 40); do
  if has_runtime; then echo "ensure-gvisor: runtime '$runtime' registered ($path)" >&2; exit 0; fi
  sleep 0.25
done
skip "dockerd did not pick up the runtime after SIGHUP (see its log)"
