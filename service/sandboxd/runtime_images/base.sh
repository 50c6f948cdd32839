#!/usr/bin/env bash
# Build the `base` runtime image: Debian 12 with bash, python3, curl and a user named `user` whose
# home /home/user is a symlink to /workspace (the only writable path of a sandbox; the image's root
# is read-only and the session still runs as its own non-root uid). The E2B-compatible door's
# commands run as `/bin/bash -l -c CMD` in it. Built offline with debootstrap from the apt mirror
# this machine already uses, like python.sh beside it (one to three minutes).
# Rebuilds only when this recipe changes: the recipe's hash is stored as an image label.
# Callable on its own (the first start of a server may run it): IMAGE defaults to
# sandboxd-runtime:base.
set -euo pipefail
image=${1:-sandboxd-runtime:base}
recipe=$(sha256sum "$0" | cut -c1-16)

current=$(docker image inspect --format '{{index .Config.Labels "sandboxd.recipe"}}' "$image" 2>/dev/null || true)
if [ "$current" = "$recipe" ]; then exit 0; fi

if ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "build-base-image: needs debootstrap (Debian: apt-get install debootstrap)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq debootstrap >/dev/null
fi

mirror=$(grep -rhoE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
  /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | awk '{print $1}' | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=bash,python3,curl,ca-certificates,procps \
  bookworm "$root" "$mirror" >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root/workspace"
mkdir -p "$root/.sandboxd" "$root/home"
# The user of E2B's model: a name and a home. Its uid is a placeholder: every session runs as
# its own host uid, whatever the image says (SECURITY.md, "E2B-compatible door").
grep -q '^user:' "$root/etc/passwd" || echo 'user:x:1000:1000:user:/home/user:/bin/bash' >>"$root/etc/passwd"
grep -q '^user:' "$root/etc/group" || echo 'user:x:1000:' >>"$root/etc/group"
ln -sfn /workspace "$root/home/user"
# A login shell (E2B runs `bash -l -c CMD`) in the workspace shows it as the home, so `pwd` and
# relative paths read as E2B's do; the directory is the same.
mkdir -p "$root/etc/profile.d"
cat >"$root/etc/profile.d/00-home.sh" <<'PROFILE'
export HOME=/home/user USER=user LOGNAME=user
case "$PWD" in /workspace | /workspace/*) cd "/home/user${PWD#/workspace}" 2>/dev/null || true ;; esac
PROFILE
grep -q '^sandboxd-keeper:' "$root/etc/passwd" ||
  echo 'sandboxd-keeper:x:65533:65533:sandboxd keeper:/:/bin/false' >>"$root/etc/passwd"
grep -q ':65533:' "$root/etc/group" || echo 'sandboxd-keeper:x:65533:' >>"$root/etc/group"
tar -C "$root" -c . | docker import --change "LABEL sandboxd.recipe=$recipe" \
  --change "ENV HOME=/home/user" --change "ENV USER=user" - "$image" >/dev/null
echo "built $image"
