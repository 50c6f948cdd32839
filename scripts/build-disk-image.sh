#!/usr/bin/env bash
# Build the disk tool image offline (no registry): busybox plus the host's e2fsprogs and
# util-linux tools that make, attach, copy and check a disk workspace's ext4 image
# (docs/workspaces.md). The server runs it as a short-lived privileged container through the
# engine API; it holds no shell script of its own: the server sends a fixed one.
# Rebuilds only when this recipe changes: the recipe's hash is stored as an image label.
set -euo pipefail
image=${1:-sandboxd-disktool:1}
recipe=$(sha256sum "$0" | cut -c1-16)

current=$(docker image inspect --format '{{index .Config.Labels "sandboxd.recipe"}}' "$image" 2>/dev/null || true)
if [ "$current" = "$recipe" ]; then exit 0; fi

tools=(/usr/sbin/mke2fs /usr/sbin/e2fsck /usr/sbin/debugfs /usr/sbin/resize2fs /usr/sbin/losetup
       /usr/bin/cp /usr/bin/du /usr/bin/stat)
missing=()
for t in "${tools[@]}" /bin/busybox; do [ -x "$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "build-disk-image: needs ${missing[*]} (Debian: e2fsprogs mount coreutils busybox-static)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq e2fsprogs mount coreutils busybox-static >/dev/null
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,etc,tmp,lib64,lib/x86_64-linux-gnu}
cp /bin/busybox "$root/bin/busybox"
for applet in sh truncate test cat echo printf rm mkdir ls true sync; do
  ln -sf busybox "$root/bin/$applet"
done
for t in "${tools[@]}"; do
  cp "$t" "$root/sbin/$(basename "$t")"
  # every shared library the tool links, at the path the loader looks for it
  for lib in $(ldd "$t" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
printf 'root:x:0:0:root:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
chmod 1777 "$root/tmp"
tar -C "$root" -c . | docker import \
  --change "LABEL sandboxd.recipe=$recipe" \
  --change 'ENV PATH=/sbin:/bin' \
  --change 'CMD ["/bin/sh"]' \
  - "$image" >/dev/null
echo "build-disk-image: built $image" >&2
