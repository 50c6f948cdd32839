#!/usr/bin/env bash
# Make sure a Docker engine answers. On a user's machine it already does and this does nothing.
# On a fresh Debian machine run as root (CI, a new dev box) it installs docker.io and starts dockerd.
set -euo pipefail

answers() { docker version --format '{{.Server.APIVersion}}' >/dev/null 2>&1; }

if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ] && command -v docker >/dev/null 2>&1 && answers; then exit 0; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-docker: no Docker engine found; install Docker (https://docs.docker.com/engine/install/) or set DOCKER_HOST" >&2
    exit 1
  fi
  echo "ensure-docker: installing docker.io from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

if answers; then exit 0; fi

if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
  echo "ensure-docker: the engine at DOCKER_HOST=$DOCKER_HOST does not answer" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-docker: the Docker engine does not answer and only root can start it here; start Docker (e.g. 'sudo systemctl start docker')" >&2
  exit 1
fi

log=${DOCKERD_LOG:-/var/log/sandboxd-dockerd.log}
# An engine this script starts runs in experimental mode: Docker's checkpoints (memory suspends
# of gVisor sessions, docs/suspend.md) need it, and it can only be set at the engine's start.
# Unless the operator's daemon.json says otherwise (a flag and a daemon.json key may not both be
# given). An engine already running is never restarted: ensure-gvisor.sh says what to do.
flags=()
if ! grep -qs '"experimental"' "${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"; then
  flags+=(--experimental)
fi
echo "ensure-docker: starting dockerd ${flags[*]} (log: $log)" >&2
# setsid: the engine must outlive this make invocation.
setsid dockerd "${flags[@]}" >"$log" 2>&1 < /dev/null &
for _ in $(seq 1 120); do
  if answers; then exit 0; fi
  sleep 0.5
done
echo "ensure-docker: dockerd did not answer within 60 s; see $log" >&2
tail -n 20 "$log" >&2 || true
exit 1
