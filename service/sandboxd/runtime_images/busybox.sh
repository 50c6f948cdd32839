#!/usr/bin/env bash
# Build the default runtime image offline from Debian's busybox-static (no registry needed).
# Rebuilds only when this recipe changes: the recipe's hash is stored as an image label.
set -euo pipefail
image=${1:-sandboxd-runtime:busybox}
recipe=$(sha256sum "$0" | cut -c1-16)

current=$(docker image inspect --format '{{index .Config.Labels "sandboxd.recipe"}}' "$image" 2>/dev/null || true)
if [ "$current" = "$recipe" ]; then exit 0; fi

if [ ! -x /bin/busybox ] || ! /bin/busybox --list | grep -qx nc; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "build-runtime-image: needs a static busybox at /bin/busybox (Debian: busybox-static)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq busybox-static >/dev/null
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# no workspace/ here: Docker would copy its mode over the tmpfs mode=0700
mkdir -p "$root"/{bin,usr/bin,usr/local/bin,etc,tmp,.sandboxd}
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] && continue
  ln -sf busybox "$root/bin/$applet"
done
ln -sf ../../bin/busybox "$root/usr/bin/realpath"
ln -sf ../../bin/busybox "$root/usr/bin/timeout"
ln -sf ../../bin/busybox "$root/usr/bin/env"
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/workspace:/bin/sh
sandboxd-keeper:x:65533:65533:sandboxd keeper:/:/bin/false
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
sandboxd-keeper:x:65533:
GROUP
chmod 1777 "$root/tmp"
tar -C "$root" -c . | docker import \
  --change "LABEL sandboxd.recipe=$recipe" \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'CMD ["/bin/sh"]' \
  - "$image" >/dev/null
echo "build-runtime-image: built $image" >&2
