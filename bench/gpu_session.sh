#!/usr/bin/env bash
# The GPU path in one prepared run, for a machine with an NVIDIA GPU (a session lent a device):
#   1. bench/gpu_check.py: NVML fields, CUDA kernels and memcpy in the pattern document (healthy,
#      pinned, a co-located GPU workload);
#   2. bench/nvml_record.py: what NVML reports idle and under load, recorded for replay tests;
#   3. the gpu-marked tests;
#   4. `eroica run -- torchrun` of examples/train_ddp.py on the GPU, four ranks sharing it: healthy,
#      rank 1 given a batch 16x larger from step 30, rank 2's loader stalled 50 ms a batch: the run
#      directories come back as runs.tgz, to be diagnosed where the engine is installed
#      (`eroica diagnose runs/imbalance`).
# Needs the image's python3 with torch and nvidia-ml-py; pydantic and msgspec come as wheels in .whl/
# (the device README says how) when the image lacks them. Writes everything under $OUT.
#
#   bash bench/gpu_session.sh                 # OUT defaults to ./gpu-session
#   DEVICE=cpu bash bench/gpu_session.sh      # the same steps on CPU (no NVML, no kernels): a dry run
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-session}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
mkdir -p "$OUT"
cd "$ROOT" || exit 2
if ! $PY -c "import eroica.collector" 2>/dev/null; then   # not installed: the source tree as the package
    if ls .whl/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl
    fi
    mkdir -p "$WORK/pkg/eroica"
    for d in schema collector engine assistant knowledge lab cli service; do ln -s "$ROOT/$d" "$WORK/pkg/eroica/$d"; done
    export PYTHONPATH="$WORK/pkg:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
step() { echo "== $* ($(date +%T))"; }

step facts
{ nvidia-smi 2>&1 | head -20; $PY -c "import torch, sys; print(sys.version); print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"; } | tee "$OUT/facts.txt"

if [ "$DEVICE" = cuda ]; then
    step gpu_check
    timeout 180 $PY bench/gpu_check.py --out "$WORK/check" 2>&1 | tail -n 40
    cp "$WORK/check/gpu_check.json" "$OUT/" 2>/dev/null
    step nvml_record
    timeout 60 $PY bench/nvml_record.py --out "$OUT/nvml_record.json" 2>&1 | tail -n 20
    step gpu tests
    timeout 120 $PY -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu \
        tests/test_gpu_path.py tests/unit/collector/test_nvml.py 2>&1 | tail -n 15
else
    timeout 180 $PY bench/gpu_check.py --cpu --steps 30 --out "$WORK/check" 2>&1 | tail -n 5
fi

ddp() {   # ddp NAME [script args...]: NPROC (4) ranks of examples/train_ddp.py on the device, attached
    local name=$1; shift
    step "eroica run: $name"
    timeout 150 $PY -c "import sys; from eroica.cli.main import entry; sys.argv[0] = 'eroica'; entry()" run \
        --out "$WORK/runs/$name" -- $PY -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-4}" \
        examples/train_ddp.py --device "$DEVICE" --steps "${STEPS:-140}" --width "${WIDTH:-1024}" \
        --batch "${BATCH:-1024}" "$@" 2>&1 | tail -n 12
    find "$WORK/runs/$name" -name 'rank-*.json' | sort | head -n 8
}
EROICA_FORCE_WINDOW_AT_STEP=60 ddp healthy      # a window to judge: the detector has nothing to catch
ddp imbalance --fault workload_imbalance --fault-rank 1 --fault-step 30 --imbalance-factor "${FACTOR:-16}"
ddp stall --fault dataloader_stall --fault-rank 2 --fault-step 30 --stall-seconds 0.05
tar czf "$OUT/runs.tgz" -C "$WORK" runs
step done
ls -la "$OUT"
