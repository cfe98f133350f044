#!/usr/bin/env bash
# The enqueue path on one GPU: enqueue_probe (layer by layer) and
# nccl_bench --enqueue-only. Every folder bin*/ holding an nccl_bench is
# run in turn, ROUNDS times (A/B of builds on one machine: copy an older
# pack's bin/ to bin-base/ before carrying).
#
#   bash .gpu/run.sh [tests|sanitize|probe|ab|full|all]    (ROUNDS=3, ITERS=30000)
#
# sanitize: the dropped-work and retire tests under compute-sanitizer
# memcheck (NCCL's own cudaFuncGetAttributes probes are API errors, hence
# --report-api-errors no).
#
# full: every bin*/nccl_bench in full (wake latency, round trips) and
# PyTorch ProcessGroupNCCL (torch_nccl.py) in the same call.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
MODE=${1:-all}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-30000}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  export CHORUS_GPU_MACHINE=1
  for t in gpu cuda nccl_gpu watchdog_gpu groups_gpu; do
    [ -x "$D/bin/$t" ] || continue
    echo "=== $t"
    timeout 240 "$D/bin/$t" --include-ignored --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1; echo "rc=$?"
    grep -E '^test |test result|panicked|unpolled' "$OUT/$t.log" | head -30
  done
  if [ -x "$D/bin/async_trainer" ]; then
    echo "=== async_trainer --device cuda --quick (1 rank)"
    timeout 120 "$D/bin/chorus-run" --nproc-per-node 1 -- "$D/bin/async_trainer" --device cuda --quick > "$OUT/trainer.log" 2>&1; echo "rc=$?"
    grep -E 'async trainer:|loss fell|bit-identical|per step|failed' "$OUT/trainer.log" | head -6
  fi
fi
if [ "$MODE" = all ] || [ "$MODE" = sanitize ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for t in gpu_dropped_work gpu_stream_ordered_ops_are_retired; do
    echo "=== compute-sanitizer memcheck: nccl_gpu $t"
    timeout 300 "$CS" --tool memcheck --report-api-errors no "$D/bin/nccl_gpu" "$t" --include-ignored --test-threads=1 > "$OUT/sanitize-$t.log" 2>&1; echo "rc=$?"
    grep -E '^test |test result|ERROR SUMMARY' "$OUT/sanitize-$t.log" | head -5
  done
fi
if [ "$MODE" = all ] || [ "$MODE" = probe ]; then
  echo "=== enqueue_probe (reactor defaults)"
  timeout 120 "$D/bin/enqueue_probe" --iters "$ITERS" 2>&1 | tee "$OUT/probe.log"
  echo "=== enqueue_probe (reactor never spins: CHORUS_REACTOR_SPIN_US=0 CHORUS_REACTOR_YIELD_US=0)"
  CHORUS_REACTOR_SPIN_US=0 CHORUS_REACTOR_YIELD_US=0 timeout 120 "$D/bin/enqueue_probe" --iters "$ITERS" 2>&1 | tee "$OUT/probe-nospin.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = ab ]; then
  for r in $(seq "$ROUNDS"); do
    for b in "$D"/bin*/; do
      [ -x "$b/nccl_bench" ] || continue
      printf '%-10s round %s: ' "$(basename "$b")" "$r"
      timeout 60 "$b/nccl_bench" --enqueue-only --iters 100000 2>&1 | grep -E '^enqueue' || echo "(failed)"
    done
  done
fi
if [ "$MODE" = all ] || [ "$MODE" = full ]; then
  for b in "$D"/bin*/; do
    [ -x "$b/nccl_bench" ] || continue
    echo "=== nccl_bench $(basename "$b")"
    timeout 120 "$b/nccl_bench" --seconds 0.5 --json "$OUT/nccl_bench-$(basename "$b").json" 2>&1 | tee "$OUT/nccl_bench-$(basename "$b").log"
  done
  echo "=== PyTorch ProcessGroupNCCL (torch_nccl.py)"
  timeout 180 python3 "$D/torch_nccl.py" --json "$OUT/torch_nccl.json" 2>&1 | tail -8
fi
