#!/usr/bin/env bash
# Generates the Go stubs (sandboxdv1/) from proto/sandboxd/v1 with Debian's protoc,
# protoc-gen-go and protoc-gen-go-grpc. `gen.sh DIR` writes into DIR instead (staleness test).
# The import path comes from each .proto's go_package option (module-relative output).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$here/sandboxdv1}
module=github.com/sandboxd/sandboxd/clients/go
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$repo/proto"
protoc -I. -I/usr/include \
  --go_out="$tmp" --go_opt=module="$module" \
  --go-grpc_out="$tmp" --go-grpc_opt=module="$module" \
  sandboxd/v1/*.proto
mkdir -p "$out"
rm -f "$out"/*.pb.go
cp "$tmp/sandboxdv1"/*.pb.go "$out/"
