#!/usr/bin/env bash
# GPU check (issue 15 item 6): on a CUDA machine with the venv set up (`make setup`), run
# the CUDA tests and the training benchmark on the GPU with bf16 autocast, and print the
# numbers. Budget: under ~5 minutes (the tests take seconds; each bench row a few tens of
# seconds including cuDNN warm-up).
#
#   tools/gpu_check.sh            # or: make gpu-check
#   VENV=/path/to/venv OUT=runs/gpu_check tools/gpu_check.sh
#
# Lives in tools/, not scripts/: CMakeLists.txt installs scripts/* as node executables.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
OUT=${OUT:-runs/gpu_check}
export MUJOCO_GL=${MUJOCO_GL:-egl}
mkdir -p "$OUT"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" - <<'PY'
import sys
import torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, "
      f"available={torch.cuda.is_available()}")
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device (CPU-only wheel or no driver); "
             "install a CUDA build of torch into the venv first")
print("device:", torch.cuda.get_device_name(0), "bf16:", torch.cuda.is_bf16_supported())
PY

echo "== CUDA tests (test/learning/test_learning_cuda.py)"
# -rs: a skip here means CUDA was not picked up, which this check must not hide.
"$PY" -m pytest test/learning/test_learning_cuda.py -q -rs -p no:cacheprovider --timeout 240

echo "== fed-ros bench train --device cuda (AMP: bf16 autocast)"
# Both kinds at the default (CPU) image profile, then the LIBERO ResNet-T-sized profile
# the GPU is meant for. 20 timed steps each after 5 warm-up steps (cuDNN autotuning).
"$VENV/bin/fed-ros" bench train --device cuda --amp --kinds lowdim,image --steps 20 \
    --warmup 5 --json "$OUT/bench_default.json"
"$VENV/bin/fed-ros" bench train --device cuda --amp --kinds image --image-profile resnet_t \
    --steps 20 --warmup 5 --json "$OUT/bench_resnet_t.json"
echo "== fed-ros bench train data-path (demonstrations on the host vs on the GPU)"
"$VENV/bin/fed-ros" bench train data-path --device cuda --steps 10 --json "$OUT/data_path.json"
echo "gpu_check: done; rows in $OUT/"
