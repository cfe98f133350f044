#!/usr/bin/env bash
# Packed by `bash benches/gpu/pack.sh nccl`; on the GPU machine (carry [".gpu"]):
# bash .gpu/run.sh [RANKS...] — the 1-rank NCCL GPU tests on GPU 0, then the
# multi-rank suite with every rank on GPU 0 (run-multirank.sh; RANKS default
# "2 4": N ranks on one GPU, correctness only), then, where there are 2 or
# more GPUs, the 2-rank scenarios one rank per GPU.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1 CHORUS_GPU_MACHINE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
nvidia-smi -L
for t in gpu nccl_gpu groups_gpu watchdog_gpu; do
  [ -x "$D/bin/$t" ] || continue
  echo "=== $t (1 rank)"
  CUDA_VISIBLE_DEVICES=0 timeout 200 "$D/bin/$t" --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1; echo "rc=$?"
  grep -E '^test |test result|panicked|nccl\(\)' "$OUT/$t.log" | head -12
done
echo "=== N ranks on one GPU: correctness only"
bash "$D/run-multirank.sh" "${@:-2 4}"; echo "rc=$?"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  for sc in matrix groups seed levels busbw; do
    echo "=== 2 ranks, one GPU each: $sc"
    timeout 200 "$D/bin/chorus-run" --nproc-per-node 2 -- "$D/bin/chorus-gpu-rank" $sc > "$OUT/2gpu-$sc.log" 2>&1; echo "rc=$?"
    grep -E 'OK|FAIL|MISMATCH|WIDTH16|START|SEED' "$OUT/2gpu-$sc.log" | head -8
  done
  grep -E '"bytes":(8|1024|65536|1048576|16777216|1073741824),' "$OUT/2gpu-busbw.log" | head -12
fi
