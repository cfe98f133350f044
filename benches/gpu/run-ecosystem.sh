#!/usr/bin/env bash
# chorus where its users already are, on one GPU: every GPU test (with the
# foreign-buffer test), the candle adapter's GPU test and tensor-parallel
# MLP, chorus programs under torchrun (its agent store), and the
# nccl_bench A/B of every bin*/ folder (copy an older pack's bin/ to
# bin-base/ before carrying).
#
#   bash .gpu/run.sh [tests|candle|torchrun|ab|full|all]    (ROUNDS=4)
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1 OMP_NUM_THREADS=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
MODE=${1:-all}; ROUNDS=${ROUNDS:-4}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for f in "$D"/bin/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
# The CUDA libraries candle links (cuBLAS, cuRAND, NVRTC, the runtime):
# PyTorch's wheels.
CU_LIB=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))')

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  export CHORUS_GPU_MACHINE=1
  for t in gpu cuda nccl_gpu watchdog_gpu groups_gpu foreign_buffer_gpu; do
    [ -x "$D/bin/$t" ] || continue
    echo "=== $t"
    timeout 240 "$D/bin/$t" --include-ignored --test-threads=1 > "$OUT/$t.log" 2>&1; echo "rc=$?"
    grep -E '^test |test result|panicked' "$OUT/$t.log" | head -30
  done
fi
if [ "$MODE" = all ] || [ "$MODE" = candle ]; then
  echo "=== candle adapter: GPU tests"
  LD_LIBRARY_PATH="$CU_LIB" timeout 240 "$D/bin/gpu-candle" --include-ignored --test-threads=1 > "$OUT/candle.log" 2>&1; echo "rc=$?"
  grep -E '^test |test result|panicked' "$OUT/candle.log" | head -20
  echo "=== tp_mlp, 1 rank"
  LD_LIBRARY_PATH="$CU_LIB" timeout 120 "$D/bin/tp_mlp" 2>&1 | tail -3; echo "rc=$?"
  LD_LIBRARY_PATH="$CU_LIB" timeout 120 "$D/bin/tp_mlp" --hidden 4096 --ffn 16384 --batch 256 2>&1 | tail -3; echo "rc=$?"
fi
if [ "$MODE" = all ] || [ "$MODE" = torchrun ]; then
  torchrun --version 2>/dev/null || python3 -c 'import torch; print("torch", torch.__version__)'
  echo "=== torchrun --no-python --nproc-per-node 4 quickstart --quick"
  timeout 180 torchrun --no-python --nproc-per-node 4 --master-port 29533 "$D/bin/quickstart" --quick > "$OUT/torchrun-quickstart.log" 2>&1; echo "rc=$?"
  grep -E 'chorus quickstart|quickstart:|error|Error|FAIL' "$OUT/torchrun-quickstart.log" | head -8
  echo "=== torchrun --standalone --nproc-per-node 4 quickstart --quick"
  timeout 180 torchrun --standalone --nproc-per-node 4 --no-python "$D/bin/quickstart" --quick > "$OUT/torchrun-standalone.log" 2>&1; echo "rc=$?"
  grep -E 'chorus quickstart|quickstart:|error|Error|FAIL' "$OUT/torchrun-standalone.log" | head -8
  echo "=== torchrun --no-python --nproc-per-node 1 async_trainer --device cuda --quick (NCCL)"
  timeout 180 torchrun --no-python --nproc-per-node 1 "$D/bin/async_trainer" --device cuda --quick > "$OUT/torchrun-trainer.log" 2>&1; echo "rc=$?"
  grep -E 'async trainer:|loss fell|bit-identical|per step|failed|rror' "$OUT/torchrun-trainer.log" | head -6
  echo "=== torchrun --no-python --nproc-per-node 1 tp_mlp (candle, NCCL)"
  LD_LIBRARY_PATH="$CU_LIB" timeout 180 torchrun --no-python --nproc-per-node 1 "$D/bin/tp_mlp" > "$OUT/torchrun-tp_mlp.log" 2>&1; echo "rc=$?"
  grep -E 'tp_mlp|rror' "$OUT/torchrun-tp_mlp.log" | head -4
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
  for pass in 1 2; do
    for b in "$D"/bin*/; do
      [ -x "$b/nccl_bench" ] || continue
      echo "=== nccl_bench $(basename "$b") pass $pass"
      timeout 120 "$b/nccl_bench" --seconds 0.5 --json "$OUT/nccl_bench-$(basename "$b")-$pass.json" > "$OUT/nccl_bench-$(basename "$b")-$pass.log" 2>&1
      tail -20 "$OUT/nccl_bench-$(basename "$b")-$pass.log"
    done
  done
fi
