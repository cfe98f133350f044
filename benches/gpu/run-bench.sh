#!/usr/bin/env bash
# Packed by `bash benches/gpu/pack.sh bench`; on the GPU machine (carry [".gpu"]):
# bash .gpu/run.sh — the full chorus-bench run (store, TCP vs Gloo, NCCL vs
# ProcessGroupNCCL, grouped vs raw NCCL vs coalescing manager) into
# $OUT/full/RESULTS.md and $OUT/full/plots.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
: "${OUT:=/tmp/out}"; mkdir -p "$OUT/full"
"$D/bin/chorus-bench" --reps 2 --bin-dir "$D/bin" --compare-dir "$D/compare" --out "$OUT/full/RESULTS.md" --plots "$OUT/full/plots" > "$OUT/full/log" 2>&1
echo "rc=$?"; tail -5 "$OUT/full/log"
