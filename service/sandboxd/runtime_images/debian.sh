#!/usr/bin/env bash
# What the Debian runtime recipes (python.sh, base.sh) share, sourced by each: the recipe check,
# debootstrap itself, the mirror, the minimal root with its keeper user, and the import. One copy,
# so both images are built, cleaned and labelled the same way. Not a recipe of its own.
# The recipe's hash covers this file as well as the recipe: a change here rebuilds both images.

# debian_recipe SCRIPT IMAGE NAME: the recipe's hash in $recipe; exits 0 when IMAGE is built from
# it already; installs debootstrap when missing (as root with apt-get), else says NAME needs it.
debian_recipe() {
  recipe=$(cat "$1" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
  local current
  current=$(docker image inspect --format '{{index .Config.Labels "sandboxd.recipe"}}' "$2" 2>/dev/null || true)
  if [ "$current" = "$recipe" ]; then exit 0; fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
      echo "$3: needs debootstrap (Debian: apt-get install debootstrap)" >&2
      exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq debootstrap >/dev/null
  fi
}

# debian_root PACKAGES: a minimal bookworm with PACKAGES (comma-separated) in $root, removed on
# exit, from the apt mirror this machine already uses; no apt caches, no /workspace (the sandbox
# mounts its own), the agent's /.sandboxd.
debian_root() {
  local mirror
  mirror=$(grep -rhoE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | awk '{print $1}' | head -1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include="$1" bookworm "$root" "$mirror" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root/workspace"
  mkdir -p "$root/.sandboxd"
}

# debian_import IMAGE [--change ...]: the keeper user added, $root imported as IMAGE with the
# recipe's label and any further changes.
debian_import() {
  local image=$1
  shift
  grep -q '^sandboxd-keeper:' "$root/etc/passwd" ||
    echo 'sandboxd-keeper:x:65533:65533:sandboxd keeper:/:/bin/false' >>"$root/etc/passwd"
  grep -q ':65533:' "$root/etc/group" || echo 'sandboxd-keeper:x:65533:' >>"$root/etc/group"
  tar -C "$root" -c . | docker import --change "LABEL sandboxd.recipe=$recipe" "$@" - "$image" >/dev/null
  echo "built $image"
}
