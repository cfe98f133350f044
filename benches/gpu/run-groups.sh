#!/usr/bin/env bash
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RUST_BACKTRACE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
MODE=${1:-all}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
echo "=== groups_gpu"
timeout 200 "$D/bin/groups_gpu" --include-ignored --test-threads=1 --nocapture > "$OUT/groups_gpu.log" 2>&1; echo "rc=$?"
grep -E '^test |test result|panicked|grouped:|bad |capture:|during capture' "$OUT/groups_gpu.log" | head -40
echo "=== nccl_gpu (regression)"
timeout 240 "$D/bin/nccl_gpu" --include-ignored --test-threads=1 > "$OUT/nccl_gpu.log" 2>&1; echo "rc=$?"
grep -E '^test |test result|panicked' "$OUT/nccl_gpu.log" | head -20
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
echo "=== group_bench"
timeout 150 "$D/bin/group_bench" --json "$OUT/group_bench.json" 2>&1 | tee "$OUT/group_bench.log"
echo "=== torch coalesce"
timeout 150 python3 "$D/torch_coalesce.py" --json "$OUT/torch_coalesce.json" 2>&1 | tail -8
echo "=== nccl_bench (enqueue regression)"
timeout 90 "$D/bin/nccl_bench" --seconds 0.5 > "$OUT/nccl_bench.log" 2>&1; echo "rc=$?"; grep -iE 'enqueue|round' "$OUT/nccl_bench.log" | head -8
fi
