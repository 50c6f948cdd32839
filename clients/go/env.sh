#!/usr/bin/env bash
# Runs a go command on the client module (clients/go) in module mode over Debian's Go sources:
# GOPROXY=off and GOFLAGS=-mod=vendor, with vendor/ (symbolic links into /usr/share/gocode,
# not committed) made by tools/debvendor when go.mod changed since it was last made.
#   clients/go/env.sh go test ./...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$here/vendor/modules.txt" ] || [ "$here/go.mod" -nt "$here/vendor/modules.txt" ]; then
  (cd / && GO111MODULE=off GOFLAGS= go run "$here/tools/debvendor/main.go" "$here")
fi
cd "$here"
export GO111MODULE=on GOPROXY=off GOFLAGS=-mod=vendor GONOSUMDB='*' GOSUMDB=off
exec "$@"
