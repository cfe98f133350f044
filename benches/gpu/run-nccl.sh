#!/usr/bin/env bash
# Packed by `bash benches/gpu/pack.sh nccl`; on the GPU machine (carry [".gpu"]):
# bash .gpu/run.sh — every NCCL GPU test on GPU 0, then (2+ GPUs) the
# 2-rank scenarios of chorus-gpu-rank: matrix, kill, groups, busbw.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
nvidia-smi -L
for t in nccl_gpu groups_gpu watchdog_gpu; do
  echo "=== $t"
  CUDA_VISIBLE_DEVICES=0 timeout 200 "$D/bin/$t" --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1; echo "rc=$?"
  grep -E '^test |test result|panicked' "$OUT/$t.log" | head -12
done
echo "=== nccl_bench (1 GPU)"
CUDA_VISIBLE_DEVICES=0 timeout 90 "$D/bin/nccl_bench" --json "$OUT/nccl_bench.json" > "$OUT/nccl_bench.log" 2>&1; echo "rc=$?"; grep -iE 'enqueue|round|in_progress' "$OUT/nccl_bench.log" | head -5
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
for sc in matrix groups busbw; do
  echo "=== 2 ranks: $sc"
  timeout 200 "$D/bin/chorus-run" --nproc-per-node 2 -- "$D/bin/chorus-gpu-rank" $sc > "$OUT/$sc.log" 2>&1; echo "rc=$?"
  grep -E 'OK|FAIL|MISMATCH|WIDTH16|START' "$OUT/$sc.log" | head -8
done
grep -E '"bytes":(8|1024|65536|1048576|16777216|1073741824),' "$OUT/busbw.log" | head -12
echo "=== 2 ranks: kill"
timeout 60 "$D/bin/chorus-run" --keep-going --nproc-per-node 2 -- "$D/bin/chorus-gpu-rank" kill > "$OUT/kill.log" 2>&1; echo "rc=$?"
grep -E 'RESULT|TEARDOWN' "$OUT/kill.log" | head
fi
