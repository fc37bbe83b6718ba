#!/usr/bin/env bash
# Create or update the project's virtual environment. Called by `make`; safe to run twice.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRA=${EXTRA:-cpu}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true

# --progress-bar off: CI logs stay readable; the filter hides noise from empty local mirrors.
"${pip[@]}" install --progress-bar off -q -e ".[$EXTRA,test]" 2>&1 | grep -v "is ignored: it is neither" || true
"${pip[@]}" show -q specserve >/dev/null

if [ "$EXTRA" = cpu ]; then
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: importing them on a CPU-only machine
  # breaks `transformers` and vLLM. Text models do not need them (research/feasibility.md §1).
  "${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" -c "import vllm, ray.serve.llm, specserve" 2>/dev/null \
  || { echo "install.sh: the environment in $VENV does not import vllm/ray.serve.llm/specserve" >&2; exit 1; }
echo "install.sh: $VENV ready (extra: $EXTRA)" >&2
