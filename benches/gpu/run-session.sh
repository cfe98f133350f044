#!/usr/bin/env bash
# Packed by `bash benches/gpu/pack.sh session`; on the GPU machine (carry [".gpu"]): bash .gpu/run.sh [trainer|watchdog|overhead|all]
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
MODE=${1:-all}
NG=$(nvidia-smi -L | wc -l)
nvidia-smi -L
if [ "$MODE" = all ] || [ "$MODE" = trainer ]; then
for n in 1 $NG; do
  for extra in "" "--sequential"; do
    echo "=== async_trainer --device cuda, $n rank(s) $extra"
    timeout 200 "$D/bin/chorus-run" --nproc-per-node $n -- "$D/bin/async_trainer" --device cuda $extra > "$OUT/trainer_${n}${extra}.log" 2>&1; echo "rc=$?"
    grep -E 'async trainer:|epoch 10|loss fell|bit-identical|per step|failed' "$OUT/trainer_${n}${extra}.log" | head -8
  done
done
fi
if [ "$MODE" = all ] || [ "$MODE" = watchdog ]; then
echo "=== watchdog_gpu (exit after an abort must be clean)"
CUDA_VISIBLE_DEVICES=0 timeout 120 "$D/bin/watchdog_gpu" --include-ignored --test-threads=1 --nocapture > "$OUT/watchdog_gpu.log" 2>&1; echo "rc=$?"
grep -E '^test |test result|panicked|Segmentation|signal' "$OUT/watchdog_gpu.log" | head
echo "=== groups_gpu"
CUDA_VISIBLE_DEVICES=0 timeout 120 "$D/bin/groups_gpu" --include-ignored --test-threads=1 > "$OUT/groups_gpu.log" 2>&1; echo "rc=$?"; grep -E 'test result' "$OUT/groups_gpu.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = overhead ]; then
echo "=== watchdog overhead: in-process A/B (rounds paused / running, ABBA blocks), pinned to cores 2-5"
for i in 1 2 3; do
  CUDA_VISIBLE_DEVICES=0 taskset -c 2-5 timeout 120 "$D/bin/watchdog_overhead" --detect-trials 0 --interleave 40 --ops 5000 > "$OUT/ovh_ab_$i.json" 2>/dev/null
  echo "run=$i $(cut -c1-160 "$OUT/ovh_ab_$i.json")"
done
fi
