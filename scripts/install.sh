#!/usr/bin/env bash
# Create or update the project's virtual environment. Called by `make`; safe to run twice.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRA=${EXTRA:-cpu}

pip_quiet() {
  # pip's own output only when it fails: CI logs stay readable. Local mirror directories that do not
  # carry a package make pip print "is ignored" warnings; they mean nothing.
  local log
  log=$(mktemp)
  if ! "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
    grep -v "is ignored: it is neither" "$log" >&2 || true
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

started=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_quiet install --progress-bar off --upgrade pip
# lab: the lab's and the benchmarks' plots and progress bars (matplotlib, tqdm), which the tests run too.
echo "install.sh: installing specserve[$EXTRA,test,lab] into $VENV (first time: a few minutes)" >&2
pip_quiet install --progress-bar off -e ".[$EXTRA,test,lab]"

if [ "$EXTRA" = cpu ]; then
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: importing them on a CPU-only machine
  # breaks `transformers` and vLLM. specserve serves text models only, which need none of the three.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# A real Prometheus server for the observability tests (Debian's package; no systemd needed: the
# tests start and stop it themselves). Only where we may install system packages.
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: installing Debian's prometheus" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
      >/dev/null 2>&1 || echo "install.sh: could not install prometheus; its tests will be skipped" >&2
  else
    echo "install.sh: prometheus not found (apt-get install prometheus); its tests will be skipped" >&2
  fi
fi

if ! check=$("$VENV/bin/python" -c "import vllm, ray.serve.llm, specserve.cluster.cli" 2>&1); then
  echo "$check" >&2
  echo "install.sh: the environment in $VENV does not import vllm / ray.serve.llm / specserve" >&2
  exit 1
fi
echo "install.sh: $VENV ready (extra: $EXTRA) in $(( $(date +%s) - started )) s" >&2
