#!/usr/bin/env bash
# Unpacks the binaries built on another machine (xz files of a carried folder) into a bin folder.
#   bash bench/device_unpack.sh [carried folder (.carry/bin)] [bin folder (/tmp/tlbin)]
set -euo pipefail
SRC=${1:-.carry/bin}
DST=${2:-/tmp/tlbin}
mkdir -p "$DST"
for f in "$SRC"/*.xz; do
  b=$(basename "$f" .xz)
  xz -dc "$f" >"$DST/$b" || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f" >"$DST/$b"
  chmod +x "$DST/$b"
done
ls "$DST"
