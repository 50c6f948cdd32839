#!/usr/bin/env bash
# Build a Debian runtime image with python3 and its standard library (a real HTTP/TLS client for
# the egress tests) with debootstrap from the apt mirror this machine already uses. About 230 MB,
# one to two minutes.
# Rebuilds only when this recipe (or debian.sh beside it) changes: the hash is an image label.
set -euo pipefail
image=${1:-sandboxd-runtime:python}
source "$(dirname "$0")/debian.sh"
debian_recipe "$0" "$image" build-python-image

debian_root python3,ca-certificates
debian_import "$image"
