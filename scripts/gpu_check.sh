#!/usr/bin/env bash
# The CUDA path in one short run on a GPU machine (see scripts/gpu/gpu_check.py):
#   bash scripts/gpu_check.sh [OUT_DIR]
# Installs dspark over the machine's own torch (a CUDA build; scripts/install.sh keeps
# an importable torch), then checks greedy exactness and engine throughput on CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-.}}
bash scripts/install.sh
PYTHONUNBUFFERED=1 python3 scripts/gpu/gpu_check.py --out "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
