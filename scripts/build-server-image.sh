#!/usr/bin/env bash
# Build the server's image IMAGE (default sandboxd-server:latest) from packaging/Dockerfile and
# the wheel in DIST (make package), with the network off: the Python packages are downloaded
# into the build context first (pip's cache or PyPI), the base is a local image.
set -euo pipefail
image=${1:-sandboxd-server:latest}
dist=$(realpath "${2:-dist}")
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$repo/.venv/bin/python}
base=${BASE:-sandboxd-runtime:python}
wheel=$(ls "$dist"/sandboxd-[0-9]*.whl)
docker image inspect "$base" >/dev/null 2>&1 ||
  { echo "build-server-image: no $base on the engine: make python-image" >&2; exit 1; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/wheels" "$ctx/bin"
cp "$wheel" "$ctx/wheels/"
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version 3.11 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any \
  -d "$ctx/wheels" "$wheel" pip 2> >(grep -v "^WARNING: Location" >&2)
# static binaries only: they run in the base whatever libraries it has
for tool in "$(command -v docker)" /bin/busybox; do
  if [ -x "$tool" ] && ! ldd "$tool" >/dev/null 2>&1; then cp "$tool" "$ctx/bin/"; fi
done
cp "$repo/packaging/Dockerfile" "$repo/packaging/sandboxd.toml" "$ctx/"
docker build -q --network none --build-arg "BASE=$base" -t "$image" "$ctx" >/dev/null
echo "built $image"
