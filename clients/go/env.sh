#!/usr/bin/env bash
# Runs a go command in GOPATH mode over Debian's Go packages (/usr/share/gocode): this
# project reaches no Go module proxy. The repository is linked into a private GOPATH as
# `sandboxd`, so the packages import as sandboxd/clients/go/...
#   clients/go/env.sh go test sandboxd/clients/go/...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
gopath="$repo/build/gopath"
mkdir -p "$gopath/src"
ln -sfn "$repo" "$gopath/src/sandboxd"
export GOPATH="$gopath:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS=
exec "$@"
