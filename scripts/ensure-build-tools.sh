#!/usr/bin/env bash
# The in-sandbox helper (helper/*.c) is a static C binary: it needs gcc, glibc's libc.a and
# libzstd.a (the archive's compression inside the sandbox, helper/zstd.c).
set -euo pipefail
libc_a=$(gcc -print-file-name=libc.a 2>/dev/null || true)
zstd_a=$(gcc -print-file-name=libzstd.a 2>/dev/null || true)
if command -v gcc >/dev/null 2>&1 && [ -n "$libc_a" ] && [ -f "$libc_a" ] \
  && [ -f "$zstd_a" ] && [ -f /usr/include/zstd.h ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-build-tools: gcc and a static libc (Debian: gcc libc6-dev libzstd-dev) are needed to build helper/*.c" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq gcc libc6-dev libzstd-dev >/dev/null
