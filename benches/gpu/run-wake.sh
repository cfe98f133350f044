#!/usr/bin/env bash
# Completion latency and its CPU cost on one GPU: wake_probe (raw
# mechanisms and chorus on every executor) beside PyTorch
# (torch_wake.py, spinning and blocking waits); group_bench and
# group_probe with the enqueue profile; the watchdog's overhead; nccl_bench.
#
#   bash .gpu/run.sh [tests|probe|torch|groups|nccl|watchdog|all]    (SAMPLES=200; PATTERNS=fixed,random,rising
#                            # and MECHANISMS=... narrow or widen the probe and PyTorch's side)
#   bash .gpu/run.sh rt      # awaited round trips only, this build against bin/nccl_bench_a
#                            # (another build, copied in by hand), in turn (the order changing
#                            # round by round), pinned to cores 2-5 (CORES)
#   bash .gpu/run.sh modes   # the enqueue's spread across processes: the two-event rule's driver
#                            # calls alone (compare/event_modes.cu, built with nvcc) beside
#                            # nccl_bench --enqueue-only, one process each in turn (PROCS=16)
#   bash .gpu/run.sh scopes  # what the driver's speed is fixed by: per process, per context or per
#                            # pair of streams (compare/event_scopes.cu), and the address space's
#                            # layout (the calls alone and nccl_bench --enqueue-only, each process
#                            # randomized and then with `setarch -R`, in turn; PROCS=16; then
#                            # with `setarch -R` and the stack moved by the environment's size)
#   bash .gpu/run.sh calls   # which stream that speed follows: each of the three calls timed alone,
#                            # one producer with new comm streams, then one comm stream with new
#                            # producers (compare/event_calls.cu; PROCS=12)
#   bash .gpu/run.sh cpu     # whether those calls slow down with the CPU that runs them: in short
#                            # windows, a multiply chain, pointer chases through 1 and 256 MiB and
#                            # the calls in turn
#                            # (compare/cpu_modes.cu; PROCS=16)
#   bash .gpu/run.sh orders  # the group goals' ratios across processes, by how group_bench orders its
#                            # modes: in blocks, in turns of TURNS (10) iterations, interleaved
#                            # (PROCS=18, the three orders in turn)
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
MODE=${1:-all}; SAMPLES=${SAMPLES:-200}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  export CHORUS_GPU_MACHINE=1
  for t in gpu cuda nccl_gpu wake_gpu watchdog_gpu groups_gpu foreign_buffer_gpu; do
    [ -x "$D/bin/$t" ] || continue
    echo "=== $t"
    timeout 300 "$D/bin/$t" --include-ignored --test-threads=1 > "$OUT/$t.log" 2>&1; echo "rc=$?"
    grep -E '^test |test result|panicked' "$OUT/$t.log" | head -30
  done
fi
if [ "$MODE" = all ] || [ "$MODE" = probe ]; then
  echo "=== wake_probe"
  timeout 400 "$D/bin/wake_probe" --samples "$SAMPLES" ${MECHANISMS:+--mechanisms "$MECHANISMS"} ${PATTERNS:+--patterns "$PATTERNS"} > "$OUT/wake_probe.log" 2>&1; echo "rc=$?"
  grep -v '^wake_probe: ' "$OUT/wake_probe.log"; grep '^wake_probe: ' "$OUT/wake_probe.log" | tail -1
fi
if [ "$MODE" = all ] || [ "$MODE" = torch ]; then
  echo "=== PyTorch (torch_wake.py)"
  timeout 200 python3 "$D/compare/torch_wake.py" --samples "$SAMPLES" ${PATTERNS:+--patterns "$PATTERNS"} 2>&1 | grep -v Warning | tee "$OUT/torch_wake.log"
  timeout 200 python3 "$D/compare/torch_wake.py" --samples "$SAMPLES" ${PATTERNS:+--patterns "$PATTERNS"} --blocking 2>&1 | grep -v Warning | tee -a "$OUT/torch_wake.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = groups ]; then
  echo "=== group_bench (CHORUS_NCCL_PROFILE=1)"
  CHORUS_NCCL_PROFILE=1 timeout 150 "$D/bin/group_bench" --json "$OUT/group_bench.json" 2>&1 | tee "$OUT/group_bench.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = groups ]; then
  echo "=== group_probe (CHORUS_NCCL_PROFILE=1)"
  CHORUS_NCCL_PROFILE=1 timeout 150 "$D/bin/group_probe" 2>&1 | tee "$OUT/group_probe.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = watchdog ]; then
  echo "=== watchdog_overhead"
  # In one process: blocks of 10,000 awaited ops, watchdog paused and
  # running alternately (ABBA), on cores of their own.
  timeout 200 taskset -c 2-5 "$D/bin/watchdog_overhead" --interleave "${BLOCKS:-60}" --ops 10000 \
    2>&1 | tee "$OUT/watchdog_overhead.log" | tail -12
fi
if [ "$MODE" = all ] || [ "$MODE" = nccl ]; then
  echo "=== nccl_bench"
  timeout 120 "$D/bin/nccl_bench" --seconds 0.5 2>&1 | tee "$OUT/nccl_bench.log"
fi
if [ "$MODE" = rt ]; then
  echo "=== nccl_bench round trips, A/B in turn (ROUNDS=${ROUNDS:-4})"
  # A process's rate depends on where its threads land: the same cores for
  # every run (CORES, where the machine has them), builds alternating,
  # several rounds.
  pin="taskset -c ${CORES:-2-5}"; $pin true 2>/dev/null || pin=""
  # The order changes round by round: neither build always runs first.
  for i in $(seq "${ROUNDS:-4}"); do
    order="nccl_bench_a nccl_bench"; [ $((i % 2)) = 0 ] && order="nccl_bench nccl_bench_a"
    for b in $order; do
      [ -x "$D/bin/$b" ] || continue
      r=$($pin timeout 60 "$D/bin/$b" --iters 2000 --wake-iters 20 --spin-us 100 --seconds 1 2>&1 \
        | tee -a "$OUT/nccl_bench_rt.log" | grep 'round trips' | awk '{print $(NF-1)}' | tr '\n' ' ')
      echo "round $i $b: $r(block_on, wait_timeout per s)"
    done
  done
fi
if [ "$MODE" = modes ]; then
  echo "=== the enqueue across processes: driver calls alone (event_modes) and chorus (nccl_bench)"
  nvcc -O2 -o /tmp/event_modes "$D/compare/event_modes.cu" -lcuda || exit 1
  for i in $(seq "${PROCS:-16}"); do
    echo "process $i: $(timeout 60 /tmp/event_modes 60000) | chorus $(timeout 60 "$D/bin/nccl_bench" --enqueue-only --iters 30000 2>&1 | head -1 | cut -d';' -f1)"
  done | tee "$OUT/modes.log"
fi
if [ "$MODE" = scopes ]; then
  echo "=== the driver's speed within one process: new streams, new contexts (event_scopes)"
  nvcc -O2 -o /tmp/event_scopes "$D/compare/event_scopes.cu" -lcuda || exit 1
  nvcc -O2 -o /tmp/event_modes "$D/compare/event_modes.cu" -lcuda || exit 1
  for i in $(seq "${PROCS:-16}"); do
    echo "process $i: $(timeout 120 /tmp/event_scopes 30000 4 | tr '\n' ';')"
  done | tee "$OUT/scopes.log"
  echo "=== the same address space in every process (setarch -R) against a randomized one"
  fixed="setarch $(uname -m) -R"
  $fixed true || exit 1
  for i in $(seq "${PROCS:-16}"); do
    calls=$(timeout 60 /tmp/event_modes 60000); fcalls=$($fixed timeout 60 /tmp/event_modes 60000)
    enq=$(timeout 60 "$D/bin/nccl_bench" --enqueue-only --iters 30000 2>&1 | head -1 | cut -d';' -f1)
    fenq=$($fixed timeout 60 "$D/bin/nccl_bench" --enqueue-only --iters 30000 2>&1 | head -1 | cut -d';' -f1)
    echo "process pair $i: randomized: $calls | chorus $enq || fixed: $fcalls | chorus $fenq"
  done | tee "$OUT/aslr.log"
  echo "=== the same layout but the stack, moved by the size of the environment (setarch -R)"
  for n in $(seq 0 256 3840); do
    echo "environment + $n bytes: $(PAD=$(head -c "$n" /dev/zero | tr '\0' x) $fixed timeout 60 /tmp/event_modes 60000)"
  done | tee "$OUT/stack.log"
fi
if [ "$MODE" = calls ]; then
  echo "=== which stream the driver's speed follows (event_calls)"
  nvcc -O2 -o /tmp/event_calls "$D/compare/event_calls.cu" -lcuda || exit 1
  for i in $(seq "${PROCS:-12}"); do
    echo "--- process $i"; timeout 120 /tmp/event_calls 20000 4
  done | tee "$OUT/calls.log"
fi
if [ "$MODE" = cpu ]; then
  echo "=== the driver calls beside the CPU's own speed, window by window (cpu_modes)"
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node|L1d|L2|L3|Hypervisor' | tr -s ' '
  nvcc -O2 -o /tmp/cpu_modes "$D/compare/cpu_modes.cu" -lcuda || exit 1
  for i in $(seq "${PROCS:-16}"); do
    echo "process $i: $(timeout 120 /tmp/cpu_modes 300)"
  done | tee "$OUT/cpu.log"
fi
if [ "$MODE" = orders ]; then
  echo "=== group_bench at width 16 across processes: blocks, turns of ${TURNS:-10}, interleaved, in turn"
  for i in $(seq "${PROCS:-18}"); do
    case $((i % 3)) in 1) o="";; 2) o="--turns ${TURNS:-10}";; 0) o="--interleave";; esac
    r=$(timeout 120 "$D/bin/group_bench" --iters 300 --widths 16 $o 2>&1 | tee -a "$OUT/orders.log" | grep ratios)
    echo "process $i (${o:-blocks}): $r"
  done
fi
