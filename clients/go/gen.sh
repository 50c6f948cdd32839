#!/usr/bin/env bash
# Generates the Go stubs (sandboxdv1/) from proto/sandboxd/v1 with Debian's protoc,
# protoc-gen-go and protoc-gen-go-grpc. `gen.sh DIR` writes into DIR instead (staleness test).
# The Go import path is given with M options, so the shared .proto files need no go_package.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$here/sandboxdv1}
pkg=sandboxd/clients/go/sandboxdv1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=()
cd "$repo/proto"
for f in sandboxd/v1/*.proto; do
  args+=("--go_opt=M$f=$pkg" "--go-grpc_opt=M$f=$pkg")
done
protoc -I. -I/usr/include --go_out="$tmp" --go-grpc_out="$tmp" "${args[@]}" sandboxd/v1/*.proto
mkdir -p "$out"
rm -f "$out"/*.pb.go
cp "$tmp/$pkg"/*.pb.go "$out/"
