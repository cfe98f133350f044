#!/usr/bin/env bash
# N ranks on one GPU: correctness only. The multi-GPU checks of the NCCL
# backend with every rank on GPU 0 (chorus-run --share-gpu: each rank its
# own NCCL_HOSTID, NCCL over sockets on loopback, the kernels time-sharing
# the GPU). Real communicators of N ranks, real data between processes,
# real remote failures; no figure of speed.
#
#   bash run-multirank.sh [RANKS...]          (default: 2 4)
#
# For each N: matrix, groups, seed, levels and the GPU trainer on N ranks.
# Once N >= 3 is among them (the largest N): the faults — kill (PeerLost,
# re-form on fresh and on shrunk communicators, with every NCCL found),
# stop (PeerSilent), rejoin (--max-restarts), the fault-tolerant trainer
# with kills at random steps — and compute-sanitizer memcheck on a fault
# run where compute-sanitizer is found. With 2 in RANKS: matrix under
# torchrun by hand (the variables --share-gpu sets), and the candle
# adapter's tp_mlp on 2 ranks against 1 where bin/tp_mlp was packed.
# Expects bin/ beside it (pack.sh nccl); logs and multirank-summary.txt
# under $OUT.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1 OMP_NUM_THREADS=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
RANKS=${*:-2 4}
RUN="$D/bin/chorus-run"; GR="$D/bin/chorus-gpu-rank"; TR="$D/bin/gpu_trainer"
SUM="$OUT/multirank-summary.txt"; : > "$SUM"
PASSED=0; FAILED=0
# Liveness and re-form window of the fault runs (ms).
export CHORUS_PEER_LIVENESS_MS=${CHORUS_PEER_LIVENESS_MS:-3000} FAULT_WINDOW_MS=${FAULT_WINDOW_MS:-2000}
# The ranks time-share the GPU: the timing loops of `groups` stay short.
export GROUPS_ITERS=${GROUPS_ITERS:-6}

say() { echo "$*" | tee -a "$SUM"; }
secs_since() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); printf '%d.%02d' $((ms / 1000)) $((ms % 1000 / 10)); }
verdict() { # name, ok (0/1), detail
  if [ "$2" = 1 ]; then PASSED=$((PASSED+1)); say "PASS $1: $3"; else FAILED=$((FAILED+1)); say "FAIL $1: $3"; fi
}
# Runs chorus-run --share-gpu with a time limit; log in $OUT/NAME.log; sets RC and SECS.
job() { # name, limit, chorus-run args...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout -k 5 "$limit" "$RUN" --share-gpu "$@" > "$OUT/$name.log" 2>&1; RC=$?
  SECS=$(secs_since "$t0")
}
oks() { grep -c "^\[rank [0-9]*\] OK rank=" "$OUT/$1.log"; }
bad() { grep -cE "FAIL|MISMATCH|panicked|ERROR rank" "$OUT/$1.log"; }
# A scenario every rank passes.
scenario() { # N, scenario, limit
  local n=$1 sc=$2 name="$2-$1"
  job "$name" "$3" --nproc-per-node "$n" -- "$GR" "$sc"
  local ok=0; [ "$RC" = 0 ] && [ "$(oks "$name")" = "$n" ] && [ "$(bad "$name")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks, rc=$RC, $(oks "$name") of $n OK, ${SECS}s; $(grep -ohE 'checks=[0-9]+' "$OUT/$name.log" | sort -u | tr '\n' ' ')"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUM"
NCCL_PIP=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib", "libnccl.so.2"))' 2>/dev/null || true)
[ -e "${NCCL_PIP:-/nonexistent}" ] || NCCL_PIP=
say "N ranks on one GPU: correctness only (chorus-run --share-gpu; timings mean nothing)"

MAX=0
for n in $RANKS; do
  [ "$n" -gt "$MAX" ] && MAX=$n
  scenario "$n" matrix 240
  [ "$n" = "$(echo $RANKS | awk '{print $1}')" ] && grep -h "NCCL version" "$OUT/matrix-$n.log" | head -1 | tee -a "$SUM"
  grep -h "COMMS\|SUBGROUP" "$OUT/matrix-$n.log" | sort | head -3 >> "$SUM"
  scenario "$n" groups 180
  scenario "$n" seed 120
  grep -h "SEED rank=0" "$OUT/seed-$n.log" | sed 's/^/  /' | tee -a "$SUM"
  scenario "$n" levels 120
  grep -h "LEVELS rank=0 round=1" "$OUT/levels-$n.log" | sed 's/^/  /' | tee -a "$SUM"
  name=trainer-$n
  job "$name" 180 --nproc-per-node "$n" -- "$TR" --width 256 --layers 4 --batch 16 --steps 40 \
      --check-steps 3 --print-every 10 --profile-steps 0
  ok=0; [ "$RC" = 0 ] && grep -q '"ok":true' "$OUT/$name.log" && ok=1
  verdict "$name" $ok "$n ranks, rc=$RC, ${SECS}s; $(grep -hoE 'max relative difference [^:]*: [A-Z]+|bit-identical on all [0-9]+ rank\(s\) after each of [0-9]+ steps' "$OUT/$name.log" | tr '\n' ';')"
done

if echo " $RANKS " | grep -q " 2 "; then
  # torchrun, with by hand the variables --share-gpu sets.
  printf '#!/bin/sh\nexport CUDA_VISIBLE_DEVICES=0 LOCAL_RANK=0 NCCL_HOSTID="torchrun-rank$RANK" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1\nexec "$@"\n' > "$OUT/share-gpu.sh"
  chmod +x "$OUT/share-gpu.sh"
  t0=$(date +%s)
  timeout -k 5 240 torchrun --no-python --nproc-per-node 2 --master-port 29577 "$OUT/share-gpu.sh" "$GR" matrix > "$OUT/torchrun-matrix-2.log" 2>&1; RC=$?
  n_ok=$(grep -c "OK rank=" "$OUT/torchrun-matrix-2.log")
  ok=0; [ "$RC" = 0 ] && [ "$n_ok" = 2 ] && ok=1
  verdict torchrun-matrix-2 $ok "torchrun --no-python --nproc-per-node 2, rc=$RC, $n_ok of 2 OK, $(( $(date +%s) - t0 ))s"
fi

for f in "$D"/bin/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
if [ -x "$D/bin/tp_mlp" ] && echo " $RANKS " | grep -q " 2 "; then
  # The candle adapter's tensor-parallel MLP (columns and rows really split
  # over 2 ranks) against 1 rank's output; candle links PyTorch's CUDA
  # libraries.
  CU_LIB=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)
  OLD_LD=${LD_LIBRARY_PATH:-}; export LD_LIBRARY_PATH="$CU_LIB${OLD_LD:+:$OLD_LD}"
  timeout 120 "$D/bin/tp_mlp" --iters 3 > "$OUT/tp_mlp-1.log" 2>&1; RC1=$?
  job tp_mlp-2 120 --nproc-per-node 2 -- "$D/bin/tp_mlp" --iters 3
  export LD_LIBRARY_PATH="$OLD_LD"
  s1=$(grep -ohE 'sum of outputs [-0-9.e]+' "$OUT/tp_mlp-1.log" | awk '{print $4}')
  s2=$(grep -ohE 'sum of outputs [-0-9.e]+' "$OUT/tp_mlp-2.log" | awk '{print $4}')
  close=$(awk -v a="${s1:-nan}" -v b="${s2:-nan}" 'BEGIN { d = a - b; if (d < 0) d = -d; m = (a < 0 ? -a : a); print (a != "nan" && b != "nan" && d <= 1e-4 * (m > 1 ? m : 1)) ? 1 : 0 }')
  ok=0; [ "$RC1" = 0 ] && [ "$RC" = 0 ] && [ "$close" = 1 ] && grep -q "OK; sum" "$OUT/tp_mlp-2.log" && ok=1
  verdict tp_mlp-2 $ok "candle tp_mlp on 2 ranks (rc=$RC, sum $s2) against 1 rank (rc=$RC1, sum $s1), ${SECS}s"
  grep -ohE "tp_mlp: .*OK|tp_mlp: .*MISMATCH[^;]*" "$OUT/tp_mlp-1.log" "$OUT/tp_mlp-2.log" | sed 's/^/  /' | tee -a "$SUM"
fi

if [ "$MAX" -ge 3 ]; then
  n=$MAX
  fault() { # name, scenario, kind wanted, extra env...
    local name=$1 sc=$2 kind=$3; shift 3
    local t0; t0=$(date +%s%N)
    env "$@" timeout -k 5 120 "$RUN" --share-gpu --keep-going --kill-timeout 2 --nproc-per-node "$n" -- "$GR" "$sc" > "$OUT/$name.log" 2>&1; RC=$?
    SECS=$(secs_since "$t0")
    local ok=0
    [ "$(oks "$name")" = $((n-1)) ] && [ "$(bad "$name")" = 0 ] && ok=1
    verdict "$name" $ok "$n ranks, $(oks "$name") of $((n-1)) survivors OK, ${SECS}s"
    grep -hoE "RESULT rank=[0-9]+ kind=[A-Za-z]+ peer=[a-z0-9]+ elapsed_ms=[0-9]+ bound_ms=[0-9]+" "$OUT/$name.log" | sed 's/^/  /' | tee -a "$SUM"
    grep -hoE "REFORM rank=[0-9]+ .* epoch=[0-9]+|reform_ms=[0-9.]+ comm=[a-z]+ shrink_ms=[-0-9.]+ first_op_ms=[0-9.]+" "$OUT/$name.log" | paste - - | sed 's/^/  /' | tee -a "$SUM"
  }
  fault kill-fresh-$n kill PeerLost CHORUS_NCCL_REFORM=fresh
  fault kill-shrink-$n kill PeerLost CHORUS_NCCL_REFORM=shrink
  if [ -n "$NCCL_PIP" ]; then
    say "with the NCCL of the pip package ($NCCL_PIP):"
    fault kill-pip-fresh-$n kill PeerLost CHORUS_NCCL_REFORM=fresh CHORUS_NCCL_LIBRARY="$NCCL_PIP"
    grep -h "NCCL version" "$OUT/kill-pip-fresh-$n.log" | head -1 | tee -a "$SUM"
    fault kill-pip-shrink-$n kill PeerLost CHORUS_NCCL_REFORM=shrink CHORUS_NCCL_LIBRARY="$NCCL_PIP"
  fi
  fault stop-$n stop PeerSilent
  grep -h "STOPPED" "$OUT/stop-$n.log" | head -1 >> "$SUM"

  name=rejoin-$n
  job "$name" 150 --max-restarts 1 --nproc-per-node "$n" -- "$GR" rejoin
  ok=0; [ "$RC" = 0 ] && [ "$(oks "$name")" = "$n" ] && [ "$(bad "$name")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks with one killed and restarted (--max-restarts 1), rc=$RC, $(oks "$name") of $n OK, ${SECS}s"
  grep -hE "REJOIN|REJOINED" "$OUT/$name.log" | sed 's/^/  /' | tee -a "$SUM"

  name=trainer-ft-$n
  K1=$(( 6 + RANDOM % 12 )); K2=$(( 20 + RANDOM % 14 ))
  job "$name" 240 --max-restarts 2 --nproc-per-node "$n" -- "$TR" --fault-tolerant --width 256 --layers 4 \
      --batch 16 --steps 40 --check-steps 3 --print-every 10 --window-ms 2000 --kill "1@$K1" --kill "2@$K2"
  ok=0; [ "$RC" = 0 ] && grep -q '"ok":true' "$OUT/$name.log" && [ "$(grep -c 'panicked' "$OUT/$name.log")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks, rank 1 killed in step $K1 and rank 2 in step $K2 (--max-restarts 2), rc=$RC, ${SECS}s"
  grep -hE "abandoned|groups:|loss fell|bit-identical" "$OUT/$name.log" | sed 's/^/  /' | tee -a "$SUM"

  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$SAN" ]; then
    name=memcheck-kill-2
    t0=$(date +%s)
    CHORUS_PEER_LIVENESS_MS=5000 FAULT_ELEMS=262144 timeout -k 5 200 "$RUN" --share-gpu --keep-going --kill-timeout 2 \
      --nproc-per-node 2 -- "$SAN" --tool memcheck --print-limit 20 "$GR" kill > "$OUT/$name.log" 2>&1; RC=$?
    clean=$(grep -c "ERROR SUMMARY: 0 errors" "$OUT/$name.log")
    ok=0; [ "$clean" -ge 1 ] && [ "$(grep -E 'ERROR SUMMARY: [1-9]' "$OUT/$name.log" | wc -l)" = 0 ] && ok=1
    verdict "$name" $ok "compute-sanitizer memcheck on kill (2 ranks): $clean clean summary(ies), rc=$RC, $(( $(date +%s) - t0 ))s"
    grep -hE "ERROR SUMMARY|RESULT" "$OUT/$name.log" | sed 's/^/  /' | head -4 | tee -a "$SUM"
  else
    say "SKIP memcheck: no compute-sanitizer on this machine"
  fi
fi
say "N ranks on one GPU ($RANKS): correctness only — $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
