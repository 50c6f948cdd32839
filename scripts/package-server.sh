#!/usr/bin/env bash
# Build the server's wheel into DIST (default dist/): a copy of the tree with the static helper
# build/sbx placed inside the package (sandboxd/bin/sbx), so an install needs no checkout.
set -euo pipefail
dist=$(realpath -m "${1:-dist}")
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$repo/.venv/bin/python}
[ -x "$repo/build/sbx" ] || { echo "package-server: build/sbx is missing: make helper" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$repo/pyproject.toml" "$repo/README.md" "$repo/LICENSE" "$stage/"
tar -C "$repo" --exclude=__pycache__ --exclude='*.egg-info' -c service | tar -C "$stage" -x
install -D -m 0755 "$repo/build/sbx" "$stage/service/sandboxd/bin/sbx"
mkdir -p "$dist"
rm -f "$dist"/sandboxd-[0-9]*.whl
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$dist" "$stage"
ls "$dist"/sandboxd-[0-9]*.whl
