#!/usr/bin/env bash
# Build the `base` runtime image: Debian 12 with bash, python3, curl and a user named `user` whose
# home /home/user is a symlink to /workspace (the only writable path of a sandbox; the image's root
# is read-only and the session still runs as its own non-root uid). The E2B-compatible door's
# commands run as `/bin/bash -l -c CMD` in it. Built offline with debootstrap from the apt mirror
# this machine already uses, like python.sh beside it (one to three minutes).
# Rebuilds only when this recipe (or debian.sh beside it) changes: the hash is an image label.
# Callable on its own (the first start of a server may run it): IMAGE defaults to
# sandboxd-runtime:base.
set -euo pipefail
image=${1:-sandboxd-runtime:base}
source "$(dirname "$0")/debian.sh"
debian_recipe "$0" "$image" build-base-image

debian_root bash,python3,curl,ca-certificates,procps
mkdir -p "$root/home"
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
debian_import "$image" --change "ENV HOME=/home/user" --change "ENV USER=user"
