#!/usr/bin/env bash
# GPU checks on a machine with CUDA and PyTorch but no network: Ludic's own dependencies that
# the machine lacks come as wheels in .whl/ (see the device notes); results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
nvidia-smi -L; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
# 1. the GPU user paths
timeout "${GPU_S:-400}" python3 -m pytest -q -p no:cacheprovider -m gpu -s \
  tests/recipes/test_train_cuda.py tests/training/test_trainer_cuda.py \
  tests/inference/test_batch_invariant_cuda.py tests/training/test_sampling_transform_cuda_no_sync.py \
  tests/training/test_entropy_lora_cuda.py \
  tests/recipes/test_train_cuda_to_cpu.py \
  --junitxml="$OUT/gpu.xml" 2>&1 | tee "$OUT/gpu.log"
# 2. the CPU-side unit tests with CUDA visible (checkpoint RNG, device picks), in what time is left
[ "${REST_S:-120}" = 0 ] || timeout "${REST_S:-120}" python3 -m pytest -q -p no:cacheprovider -x -n 8 -m "not slow and not gpu" \
  tests/training tests/inference 2>&1 | tail -40 | tee "$OUT/rest.log"
