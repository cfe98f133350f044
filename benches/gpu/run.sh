#!/usr/bin/env bash
# The GPU suite: chorus's GPU tests, its multi-rank checks and its GPU
# benchmarks, on any Linux host with an NVIDIA GPU and its driver.
#
#   bash benches/gpu/run.sh --out DIR [MODE...]   # in a checkout with a Rust toolchain:
#                                                 # builds and packs (pack.sh) into
#                                                 # target/gpu-pack first, then runs from there
#   bash PACK/run.sh --out DIR [MODE...]          # in a folder made by pack.sh (no toolchain)
#
# Every log, JSON file and summary goes under DIR (created); DIR/summary.txt
# has one line per step (PASS, FAIL or SKIP and where the log is). Modes
# (default `all`: every mode below but candle, which runs when packed):
#
#   tests      the 1-rank GPU tests: gpu (nccl-sys), cuda (chorus-gpu), nccl_gpu,
#              batches_gpu, watchdog_gpu, wake_gpu, foreign_buffer_gpu (chorus),
#              gpu_trainer_gpu (examples)
#   sanitize   compute-sanitizer memcheck on nccl_gpu's dropped-work and retire tests
#   multirank  N ranks on one GPU, correctness only (run-multirank.sh; RANKS, default
#              "2 4"; STEPS chooses steps); with 2 or more GPUs, the 2-rank scenarios
#              one rank per GPU (matrix, groups, seed, levels, busbw)
#   wake       waking on the driver's completion: wake_probe on lengths that repeat and
#              lengths that do not (fixed, random, rising), beside torch_wake.py's two
#              waits (SAMPLES, default 40)
#   nccl       nccl_bench (enqueue, stream-ordered wait, wake, round trips) and its
#              --layers, group_bench and its --layers, beside torch_nccl.py and
#              torch_coalesce.py
#   checked    the checked mode's cost per op on the NCCL backend: nccl_bench with and
#              without CHORUS_CHECK_OPS=1 in turn, 3 rounds (ROUNDS)
#   watchdog   watchdog_overhead: the watchdog's cost (blocks of awaited ops with its
#              rounds paused and running, in turn) and how soon a timed-out op fails
#   trainer    the GPU trainer beside PyTorch DDP (torch_ddp.py), a small and a large
#              model, 1 rank, alone and under chorus-run
#   candle     the candle adapter's GPU test and its tensor-parallel MLP (pack.sh DIR candle)
#   torchrun   chorus programs under torchrun: quickstart (TCP), async_trainer on the GPU
#   bench      the full chorus-bench run: DIR/RESULTS.md (the packed benches/RESULTS.md
#              with every suite's section rewritten) and DIR/plots/; copy both back
#              into benches/ to publish them
#
# PYTHON names the Python with PyTorch (default python3); the PyTorch sides
# are skipped when it has no CUDA. NCCL_NVLS_ENABLE defaults to 0 (NVLink
# SHARP off), as every figure in benches/RESULTS.md was measured.
set -u
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
RESULTS=""; MODES=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) RESULTS=${2:-}; shift; [ $# -gt 0 ] && shift ;;
    --out=*) RESULTS=${1#--out=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    *) MODES+=("$1"); shift ;;
  esac
done
[ -n "$RESULTS" ] || { echo "--out DIR is required" >&2; usage >&2; exit 2; }
[ ${#MODES[@]} -eq 0 ] && MODES=(all)
for m in "${MODES[@]}"; do
  case $m in all|tests|sanitize|multirank|wake|nccl|checked|watchdog|trainer|candle|torchrun|bench) ;;
    *) echo "unknown mode $m" >&2; usage >&2; exit 2 ;;
  esac
done
D=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$D/bin" ]; then
  # In a checkout: build and pack first, then run from the pack.
  root=$(git -C "$D" rev-parse --show-toplevel) || { echo "no bin/ beside run.sh and not in a checkout" >&2; exit 2; }
  pack="${CARGO_TARGET_DIR:-$root/target}/gpu-pack"
  bash "$D/pack.sh" "$pack" "${MODES[@]}" || exit 1
  exec bash "$pack/run.sh" --out "$RESULTS" "${MODES[@]}"
fi
mkdir -p "$RESULTS"; RESULTS=$(cd "$RESULTS" && pwd)
BIN=$D/bin; SUM=$RESULTS/summary.txt; : > "$SUM"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} RUST_BACKTRACE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The Python with PyTorch first on PATH: python3 and torchrun are its own
# for every step.
PYTHON=${PYTHON:-python3}
if py=$(command -v "$PYTHON"); then PATH="$(dirname "$py"):$PATH"; fi
for f in "$BIN"/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done

has() { local m; for m in "${MODES[@]}"; do [ "$m" = "$1" ] || { [ "$m" = all ] && [ "$1" != candle ]; } && return 0; done; return 1; }
say() { echo "$*" | tee -a "$SUM"; }
# step NAME LOG TIMEOUT COMMAND...: runs it with a time limit, its output in LOG.
step() {
  local name=$1 log=$2 limit=$3; shift 3
  mkdir -p "$(dirname "$log")"
  echo "=== $name: $*"
  timeout -k 10 "$limit" "$@" > "$log" 2>&1; local rc=$?
  if [ $rc = 0 ]; then say "PASS $name (${log#"$RESULTS"/})"; else say "FAIL $name: rc=$rc (${log#"$RESULTS"/})"; fi
  return $rc
}
skip() { say "SKIP $1: $2"; }
torch_cuda() { "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
# The CUDA libraries candle links (cuBLAS, cuRAND, NVRTC, the runtime): PyTorch's wheels.
cuda_libs() { "$PYTHON" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null; }
# A prefix that runs a command on cores of its own, where the host has them.
PIN=(); taskset -c 2-5 true 2>/dev/null && PIN=(taskset -c 2-5)

{ echo "commit $(cat "$D/COMMIT" 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC'), modes: ${MODES[*]}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "$(getconf _NPROCESSORS_ONLN) CPUs"; } | tee -a "$SUM"

if has tests; then
  for t in gpu cuda nccl_gpu batches_gpu watchdog_gpu wake_gpu foreign_buffer_gpu gpu_trainer_gpu; do
    [ -x "$BIN/$t" ] || { skip "test $t" "not packed"; continue; }
    step "test $t" "$RESULTS/tests/$t.log" 600 env CHORUS_GPU_MACHINE=1 "$BIN/$t" --include-ignored --test-threads=1
    grep -hE 'test result' "$RESULTS/tests/$t.log" | tail -1
  done
fi

if has sanitize; then
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$san" ]; then skip sanitize "no compute-sanitizer on this host"
  elif [ ! -x "$BIN/nccl_gpu" ]; then skip sanitize "nccl_gpu not packed"
  else
    # NCCL's own cudaFuncGetAttributes probes are API errors: not reported.
    for t in gpu_dropped_work gpu_stream_ordered_ops_are_retired; do
      step "memcheck nccl_gpu $t" "$RESULTS/sanitize/$t.log" 600 "$san" --tool memcheck --report-api-errors no \
        "$BIN/nccl_gpu" "$t" --include-ignored --test-threads=1
      grep -hE 'ERROR SUMMARY' "$RESULTS/sanitize/$t.log" | tail -1
    done
  fi
fi

if has multirank; then
  # shellcheck disable=SC2086
  step "multirank (N ranks on one GPU)" "$RESULTS/multirank/run.log" 3600 bash "$D/run-multirank.sh" --out "$RESULTS/multirank" ${RANKS:-2 4}
  grep -hE '^(PASS|FAIL|SKIP)|passed,' "$RESULTS/multirank/summary.txt" 2>/dev/null | sed 's/^/  /' | tee -a "$SUM"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    for sc in matrix groups seed levels busbw; do
      step "2 ranks, one GPU each: $sc" "$RESULTS/multigpu/$sc.log" 300 "$BIN/chorus-run" --nproc-per-node 2 -- "$BIN/chorus-gpu-rank" "$sc"
    done
    grep -hE '"bytes":(8|8192|524288|8388608|134217728|1073741824),' "$RESULTS/multigpu/busbw.log" | head -12
  else
    skip "2 ranks, one GPU each" "one GPU on this host"
  fi
fi

if has wake; then
  SAMPLES=${SAMPLES:-40}
  step wake_probe "$RESULTS/wake/wake_probe.log" 1800 "$BIN/wake_probe" --samples "$SAMPLES" --lengths-us 1000,30000 \
    --patterns fixed,random,rising --random-samples 200 --rising-samples 12 --rising-cycles 3 --tail-us 0 \
    --mechanisms chorus-block_on,chorus-tokio-ct,chorus-tokio-mt-task,chorus-wait_timeout,bsync,bsync-waiter
  grep -v '^wake_probe: ' "$RESULTS/wake/wake_probe.log" | tail -60
  if torch_cuda; then
    for b in "" --blocking; do
      step "torch_wake.py $b" "$RESULTS/wake/torch_wake${b:+-blocking}.log" 900 "$PYTHON" "$D/compare/torch_wake.py" \
        --samples "$SAMPLES" --lengths-us 1000,30000 --patterns fixed,random,rising $b
      grep -v Warning "$RESULTS/wake/torch_wake${b:+-blocking}.log" | tail -30
    done
  else
    skip torch_wake.py "no PyTorch with CUDA ($PYTHON)"
  fi
fi

if has nccl; then
  step nccl_bench "$RESULTS/nccl/nccl_bench.log" 300 "$BIN/nccl_bench" --seconds 0.5 --json "$RESULTS/nccl/nccl_bench.json"
  cat "$RESULTS/nccl/nccl_bench.log"
  step "nccl_bench --layers" "$RESULTS/nccl/nccl_bench-layers.log" 300 env CHORUS_NCCL_PROFILE=1 "$BIN/nccl_bench" --layers --iters 30000
  cat "$RESULTS/nccl/nccl_bench-layers.log"
  step group_bench "$RESULTS/nccl/group_bench.log" 300 "$BIN/group_bench" --json "$RESULTS/nccl/group_bench.json"
  cat "$RESULTS/nccl/group_bench.log"
  step "group_bench --layers" "$RESULTS/nccl/group_bench-layers.log" 300 env CHORUS_NCCL_PROFILE=1 "$BIN/group_bench" --layers --widths 16 --iters 3000
  cat "$RESULTS/nccl/group_bench-layers.log"
  if torch_cuda; then
    step torch_nccl.py "$RESULTS/nccl/torch_nccl.log" 300 "$PYTHON" "$D/compare/torch_nccl.py" --json "$RESULTS/nccl/torch_nccl.json"
    step torch_coalesce.py "$RESULTS/nccl/torch_coalesce.log" 300 "$PYTHON" "$D/compare/torch_coalesce.py" --json "$RESULTS/nccl/torch_coalesce.json"
    tail -n 8 "$RESULTS/nccl/torch_nccl.log" "$RESULTS/nccl/torch_coalesce.log"
  else
    skip "torch_nccl.py, torch_coalesce.py" "no PyTorch with CUDA ($PYTHON)"
  fi
fi

if has checked; then
  # Unchecked first in odd rounds, checked first in even ones.
  for r in $(seq "${ROUNDS:-3}"); do
    order="0 1"; [ $((r % 2)) = 0 ] && order="1 0"
    for c in $order; do
      step "nccl_bench, CHORUS_CHECK_OPS=$c, round $r" "$RESULTS/checked/nccl_bench-check$c-$r.log" 300 \
        env CHORUS_CHECK_OPS="$c" "$BIN/nccl_bench" --seconds 0.5 --json "$RESULTS/checked/nccl_bench-check$c-$r.json"
      grep -hE '^enqueue|round trips' "$RESULTS/checked/nccl_bench-check$c-$r.log"
    done
  done
fi

if has watchdog; then
  # In one process: blocks of 10,000 awaited ops, the watchdog's rounds
  # paused and running in turn (ABBA), on cores of their own.
  step "watchdog_overhead (cost)" "$RESULTS/watchdog/overhead.log" 900 "${PIN[@]}" "$BIN/watchdog_overhead" \
    --detect-trials 0 --interleave 400 --ops 10000
  tail -12 "$RESULTS/watchdog/overhead.log"
  step "watchdog_overhead (detection)" "$RESULTS/watchdog/detect.log" 300 "$BIN/watchdog_overhead" \
    --reps 1 --ops 2000 --detect-trials 30
  tail -6 "$RESULTS/watchdog/detect.log"
fi

if has trainer; then
  SMALL="--width 1024 --layers 4 --batch 32 --steps 300 --lr 6"
  LARGE="--width 8192 --layers 4 --batch 128 --steps 400 --lr 6 --check-steps 2 --print-every 100"
  T=$RESULTS/trainer
  # shellcheck disable=SC2086
  {
    step "gpu_trainer, small" "$T/chorus-small.log" 300 "$BIN/gpu_trainer" $SMALL --profile "$T/chorus-small-trace.json"
    step "gpu_trainer, large" "$T/chorus-large.log" 300 "$BIN/gpu_trainer" $LARGE --profile "$T/chorus-large-trace.json"
    step "gpu_trainer under chorus-run, small" "$T/chorus-run-small.log" 300 "$BIN/chorus-run" --nproc-per-node 1 -- "$BIN/gpu_trainer" $SMALL
    if torch_cuda; then
      step "torch_ddp.py, small" "$T/torch-small.log" 300 "$PYTHON" "$D/compare/torch_ddp.py" $SMALL --profile "$T/torch-small-trace.json"
      step "torch_ddp.py, large" "$T/torch-large.log" 300 "$PYTHON" "$D/compare/torch_ddp.py" $LARGE
    else
      skip torch_ddp.py "no PyTorch with CUDA ($PYTHON)"
    fi
  }
  grep -h '^summary' "$T"/*.log > "$T/summaries.jsonl" 2>/dev/null
  cat "$T/summaries.jsonl"
fi

if has candle; then
  if [ -x "$BIN/gpu-candle" ] && [ -x "$BIN/tp_mlp" ]; then
    lib=$(cuda_libs)
    step "candle adapter: GPU test" "$RESULTS/candle/gpu.log" 600 env LD_LIBRARY_PATH="$lib" "$BIN/gpu-candle" --include-ignored --test-threads=1
    step "tp_mlp, 1 rank" "$RESULTS/candle/tp_mlp.log" 300 env LD_LIBRARY_PATH="$lib" "$BIN/tp_mlp"
    step "tp_mlp, 1 rank, large" "$RESULTS/candle/tp_mlp-large.log" 300 env LD_LIBRARY_PATH="$lib" "$BIN/tp_mlp" --hidden 4096 --ffn 16384 --batch 256
    tail -n 3 "$RESULTS/candle/tp_mlp.log" "$RESULTS/candle/tp_mlp-large.log"
  else
    skip candle "not packed (bash benches/gpu/pack.sh DIR candle)"
  fi
fi

if has torchrun; then
  if command -v torchrun >/dev/null 2>&1; then
    step "torchrun quickstart, 4 ranks" "$RESULTS/torchrun/quickstart.log" 300 torchrun --no-python --nproc-per-node 4 \
      --master-port 29533 "$BIN/quickstart" --quick
    step "torchrun --standalone quickstart, 4 ranks" "$RESULTS/torchrun/quickstart-standalone.log" 300 torchrun --standalone \
      --nproc-per-node 4 --no-python "$BIN/quickstart" --quick
    step "torchrun async_trainer --device cuda" "$RESULTS/torchrun/async_trainer.log" 300 torchrun --no-python \
      --nproc-per-node 1 "$BIN/async_trainer" --device cuda --quick
    grep -hE 'quickstart:|loss fell|bit-identical|per step' "$RESULTS"/torchrun/*.log | head -12
  else
    skip torchrun "torchrun not on PATH"
  fi
fi

if has bench; then
  cp "$D/RESULTS.md" "$RESULTS/RESULTS.md"
  step chorus-bench "$RESULTS/bench.log" 3600 "$BIN/chorus-bench" --commit "$(cat "$D/COMMIT" 2>/dev/null || echo unknown)" \
    --bin-dir "$BIN" --compare-dir "$D/compare" --out "$RESULTS/RESULTS.md" --plots "$RESULTS/plots"
  tail -5 "$RESULTS/bench.log"
fi

say "done: $(grep -c '^PASS' "$SUM") passed, $(grep -c '^FAIL' "$SUM") failed, $(grep -c '^SKIP' "$SUM") skipped; logs in $RESULTS"
! grep -q '^FAIL' "$SUM"
