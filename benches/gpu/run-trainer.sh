#!/usr/bin/env bash
# The GPU trainer beside PyTorch DDP on one GPU (pack: bash
# benches/gpu/pack.sh trainer; run: bash .gpu/run.sh). Small model
# (4 x 1024, batch 32: the host path dominates) and large (4 x 8192,
# batch 128: the GPU dominates), 1 rank, chorus alone, torch_ddp.py, and
# chorus under chorus-run; then the trainer's GPU test. Logs under $OUT;
# every run ends with a `summary {json}` line.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1 OMP_NUM_THREADS=1 CHORUS_GPU_MACHINE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SMALL="--width 1024 --layers 4 --batch 32 --steps 300 --lr 6"
LARGE="--width 8192 --layers 4 --batch 128 --steps 400 --lr 6 --check-steps 2 --print-every 100"
run() { # name, timeout, command...
  local name=$1 t=$2; shift 2
  echo "=== $name: $*"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"
  grep -E 'gpu trainer:|torch DDP:|vs CPU|loss fell|bit-identical|per step|summary|rror|FAIL|panicked' "$OUT/$name.log" | head -12
}
run chorus-small 120 "$D/bin/gpu_trainer" $SMALL --profile "$OUT/chorus-small-trace.json"
run torch-small 120 python3 "$D/compare/torch_ddp.py" $SMALL --profile "$OUT/torch-small-trace.json"
run chorus-large 150 "$D/bin/gpu_trainer" $LARGE --profile "$OUT/chorus-large-trace.json"
run torch-large 150 python3 "$D/compare/torch_ddp.py" $LARGE
run chorus-run-small 120 "$D/bin/chorus-run" --nproc-per-node 1 -- "$D/bin/gpu_trainer" $SMALL
echo "=== gpu_trainer_gpu (test)"
timeout 180 "$D/bin/gpu_trainer_gpu" --include-ignored --test-threads=1 > "$OUT/gpu_trainer_gpu.log" 2>&1; echo "rc=$?"
grep -E '^test |test result|panicked' "$OUT/gpu_trainer_gpu.log" | head
grep -h '^summary' "$OUT"/*.log > "$OUT/summaries.jsonl"
