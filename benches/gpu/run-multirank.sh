#!/usr/bin/env bash
# N ranks on one GPU: correctness only. The multi-GPU checks of the NCCL
# backend with every rank on GPU 0 (chorus-run --share-gpu: each rank its
# own NCCL_HOSTID, NCCL over sockets on loopback, the kernels time-sharing
# the GPU). Real communicators of N ranks, real data between processes,
# real remote failures; no figure of speed.
#
#   bash run-multirank.sh --out DIR [RANKS...]          (default: 2 4)
#   STEPS="matrix:4 kill-fresh:4 ..." bash run-multirank.sh --out DIR
#
# Steps, NAME:N (N ranks):
#   matrix, groups, seed, levels   chorus-gpu-rank's scenario, every rank OK
#   checked                        the checked mode (CHORUS_CHECK_OPS=1): device collectives called
#                                  differently refused on every rank with Mismatch, the group usable
#   trainer                        gpu_trainer: CPU reference, bit-identical parameters
#   torchrun                       matrix under torchrun, the --share-gpu variables set by hand
#   tp_mlp                         the candle adapter's tensor-parallel MLP against 1 rank (if packed)
#   kill-fresh, kill-shrink        SIGKILL one rank mid all_reduce: PeerLost naming it within the
#                                  liveness timeout + 1 s, re-form on fresh / shrunk communicators
#   kill-pip-fresh, kill-pip-shrink   the same with the pip package's NCCL (if found): a killed
#                                  peer leaves NCCL's remote error, so shrink falls back to fresh
#   stop-pip-fresh, stop-pip-shrink   SIGSTOP with the pip package's NCCL: the revoked communicator
#                                  is clean and shrunk
#   stop                           SIGSTOP one rank: PeerSilent, re-form
#   rejoin                         one rank killed and restarted (--max-restarts 1): rejoins,
#                                  parameters bit-identical and equal to the serial reference
#   trainer-ft                     gpu_trainer --fault-tolerant, ranks 1 and 2 killed at random steps
#   memcheck                       compute-sanitizer memcheck on kill (if found)
# Without STEPS: for each N of RANKS matrix, groups, seed, levels, trainer;
# torchrun and tp_mlp with 2 ranks; the faults with the largest N (3 or
# more). Runs the executables of bin/ beside it (a folder made by
# pack.sh; run.sh's `multirank` mode runs this script); each step's log,
# and summary.txt, go under DIR.
set -u
D=$(cd "$(dirname "$0")" && pwd)
[ "${1:-}" = --out ] && [ -n "${2:-}" ] || { echo "usage: bash run-multirank.sh --out DIR [RANKS...]" >&2; exit 2; }
LOGS=$2; shift 2
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} RUST_BACKTRACE=1 OMP_NUM_THREADS=1
RANKS=${*:-2 4}
RUN="$D/bin/chorus-run"; GR="$D/bin/chorus-gpu-rank"; TR="$D/bin/gpu_trainer"
SUM="$LOGS/summary.txt"; touch "$SUM"
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
# Runs chorus-run --share-gpu with a time limit; log in $LOGS/NAME.log; sets RC and SECS.
job() { # name, limit, chorus-run args...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout -k 5 "$limit" "$RUN" --share-gpu "$@" > "$LOGS/$name.log" 2>&1; RC=$?
  SECS=$(secs_since "$t0")
}
oks() { grep -c "^\[rank [0-9]*\] OK rank=" "$LOGS/$1.log"; }
bad() { grep -cE "FAIL|MISMATCH|panicked|ERROR rank" "$LOGS/$1.log"; }
indent() { sed -e 's/^\[rank [0-9]*\] //' -e 's/^/  /' | tee -a "$SUM"; }

# A scenario every rank passes.
scenario() { # scenario, N
  local sc=$1 n=$2 name="$1-$2"
  job "$name" 240 --nproc-per-node "$n" -- "$GR" "$sc"
  local ok=0; [ "$RC" = 0 ] && [ "$(oks "$name")" = "$n" ] && [ "$(bad "$name")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks, rc=$RC, $(oks "$name") of $n OK, ${SECS}s; $(grep -ohE 'checks=[0-9]+' "$LOGS/$name.log" | sort -u | tr '\n' ' ')"
  grep -h "NCCL version" "$LOGS/$name.log" | head -1 | indent
  case $sc in
    matrix) grep -h "COMMS rank=0" "$LOGS/$name.log" | indent ;;
    seed) grep -h "SEED rank=0" "$LOGS/$name.log" | indent ;;
    levels) grep -h "LEVELS rank=0 round=1" "$LOGS/$name.log" | indent ;;
  esac
}

trainer() { # N
  local n=$1 name=trainer-$1
  job "$name" 180 --nproc-per-node "$n" -- "$TR" --width 256 --layers 4 --batch 16 --steps 80 \
      --check-steps 3 --print-every 10 --profile-steps 0
  local ok=0; [ "$RC" = 0 ] && grep -q '"ok":true' "$LOGS/$name.log" && ok=1
  verdict "$name" $ok "$n ranks, rc=$RC, ${SECS}s; $(grep -hoE 'max relative difference [^:]*: [A-Z]+|bit-identical on all [0-9]+ rank\(s\) after each of [0-9]+ steps' "$LOGS/$name.log" | tr '\n' ';')"
}

torchrun_matrix() { # N
  local n=$1 name=torchrun-matrix-$1
  # The variables --share-gpu sets, by hand.
  printf '#!/bin/sh\nexport CUDA_VISIBLE_DEVICES=0 LOCAL_RANK=0 NCCL_HOSTID="torchrun-rank$RANK" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1\nexec "$@"\n' > "$LOGS/share-gpu.sh"
  chmod +x "$LOGS/share-gpu.sh"
  local t0; t0=$(date +%s%N)
  timeout -k 5 240 torchrun --no-python --nproc-per-node "$n" --master-port 29577 "$LOGS/share-gpu.sh" "$GR" matrix > "$LOGS/$name.log" 2>&1; RC=$?
  local n_ok; n_ok=$(grep -c "OK rank=" "$LOGS/$name.log")
  local ok=0; [ "$RC" = 0 ] && [ "$n_ok" = "$n" ] && ok=1
  verdict "$name" $ok "torchrun --no-python --nproc-per-node $n, rc=$RC, $n_ok of $n OK, $(secs_since "$t0")s"
}

tp_mlp() { # N
  local n=$1
  for f in "$D"/bin/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
  if [ ! -x "$D/bin/tp_mlp" ]; then say "SKIP tp_mlp-$n: bin/tp_mlp not packed"; return; fi
  # The candle adapter's tensor-parallel MLP (columns and rows really split
  # over N ranks) against 1 rank's output; candle links PyTorch's CUDA
  # libraries.
  local cu old=${LD_LIBRARY_PATH:-}
  cu=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH="$cu${old:+:$old}"
  timeout 120 "$D/bin/tp_mlp" --iters 3 > "$LOGS/tp_mlp-1.log" 2>&1; local rc1=$?
  job "tp_mlp-$n" 120 --nproc-per-node "$n" -- "$D/bin/tp_mlp" --iters 3
  export LD_LIBRARY_PATH="$old"
  local s1 s2 close
  s1=$(grep -ohE 'sum of outputs [-0-9.e]+' "$LOGS/tp_mlp-1.log" | awk '{print $4}')
  s2=$(grep -ohE 'sum of outputs [-0-9.e]+' "$LOGS/tp_mlp-$n.log" | awk '{print $4}')
  close=$(awk -v a="${s1:-x}" -v b="${s2:-x}" 'BEGIN { if (a == "x" || b == "x") { print 0; exit } d = a - b; if (d < 0) d = -d; m = (a < 0 ? -a : a); print (d <= 1e-4 * (m > 1 ? m : 1)) ? 1 : 0 }')
  local ok=0; [ "$rc1" = 0 ] && [ "$RC" = 0 ] && [ "$close" = 1 ] && grep -q "OK; sum" "$LOGS/tp_mlp-$n.log" && ok=1
  verdict "tp_mlp-$n" $ok "candle tp_mlp on $n ranks (rc=$RC, sum $s2) against 1 rank (rc=$rc1, sum $s1), ${SECS}s"
  grep -ohE "tp_mlp: [0-9]+ rank\(s\)[^;]*; [^;]*" "$LOGS/tp_mlp-1.log" "$LOGS/tp_mlp-$n.log" | indent
}

fault() { # name, N, scenario, kind wanted, extra env...
  local name=$1 n=$2 sc=$3 kind=$4; shift 4
  local t0; t0=$(date +%s%N)
  env "$@" timeout -k 5 120 "$RUN" --share-gpu --keep-going --kill-timeout 2 --nproc-per-node "$n" -- "$GR" "$sc" > "$LOGS/$name.log" 2>&1; RC=$?
  SECS=$(secs_since "$t0")
  local ok=0
  [ "$(oks "$name")" = $((n-1)) ] && [ "$(bad "$name")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks, $(oks "$name") of $((n-1)) survivors OK ($kind wanted), ${SECS}s"
  grep -h "NCCL version" "$LOGS/$name.log" | head -1 | indent
  grep -hoE "RESULT rank=[0-9]+ kind=[A-Za-z]+ peer=[a-z0-9]+ elapsed_ms=[0-9]+ bound_ms=[0-9]+" "$LOGS/$name.log" | indent
  grep -hoE "REFORM rank=[0-9]+ new_rank=[0-9]+ size=[0-9]+ epoch=[0-9]+|reform_ms=[0-9.]+ comm=[a-z]+ shrink_ms=[-0-9.]+ first_op_ms=[0-9.]+" "$LOGS/$name.log" | paste - - | indent
}

# The NCCL of PyPI's nvidia-nccl-cu12/-cu13 (PyTorch's), found on Python's
# path (a namespace package: no __file__ to ask).
NCCL_PIP=$(python3 -c 'import glob, os, sys
hits = [h for p in sys.path if p for h in sorted(glob.glob(os.path.join(p, "nvidia", "nccl", "lib", "libnccl.so*")))]
print(hits[0] if hits else "")' 2>/dev/null || true)
[ -e "${NCCL_PIP:-/nonexistent}" ] || NCCL_PIP=
pip_fault() { # name, N, reform, scenario, kind wanted
  if [ -z "$NCCL_PIP" ]; then say "SKIP $1: no pip package nvidia-nccl"; return; fi
  fault "$1" "$2" "$4" "$5" CHORUS_NCCL_REFORM="$3" CHORUS_NCCL_LIBRARY="$NCCL_PIP"
}

rejoin() { # N
  local n=$1 name=rejoin-$1
  job "$name" 150 --max-restarts 1 --nproc-per-node "$n" -- "$GR" rejoin
  local ok=0; [ "$RC" = 0 ] && [ "$(oks "$name")" = "$n" ] && [ "$(bad "$name")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks with one killed and restarted (--max-restarts 1), rc=$RC, $(oks "$name") of $n OK, ${SECS}s"
  grep -hE "REJOIN |REJOINED" "$LOGS/$name.log" | indent
}

trainer_ft() { # N
  local n=$1 name=trainer-ft-$1
  local k1=$(( 6 + RANDOM % 12 )) k2=$(( 20 + RANDOM % 14 ))
  job "$name" 240 --max-restarts 2 --nproc-per-node "$n" -- "$TR" --fault-tolerant --width 256 --layers 4 \
      --batch 16 --steps 80 --check-steps 3 --print-every 10 --window-ms 2000 --kill "1@$k1" --kill "2@$k2"
  local ok=0; [ "$RC" = 0 ] && grep -q '"ok":true' "$LOGS/$name.log" && [ "$(grep -c 'panicked' "$LOGS/$name.log")" = 0 ] && ok=1
  verdict "$name" $ok "$n ranks, rank 1 killed in step $k1 and rank 2 in step $k2 (--max-restarts 2), rc=$RC, ${SECS}s"
  grep -hE "abandoned|groups:|loss fell|bit-identical" "$LOGS/$name.log" | indent
}

memcheck() { # N
  local n=$1 name=memcheck-kill-$1
  local san; san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$san" ]; then say "SKIP $name: no compute-sanitizer on this machine"; return; fi
  local t0; t0=$(date +%s%N)
  CHORUS_PEER_LIVENESS_MS=5000 FAULT_ELEMS=262144 timeout -k 5 200 "$RUN" --share-gpu --keep-going --kill-timeout 2 \
    --nproc-per-node "$n" -- "$san" --tool memcheck --report-api-errors no --print-limit 20 "$GR" kill > "$LOGS/$name.log" 2>&1; RC=$?
  local clean; clean=$(grep -c "ERROR SUMMARY: 0 errors" "$LOGS/$name.log")
  local ok=0; [ "$clean" -ge $((n-1)) ] && [ "$(grep -cE 'ERROR SUMMARY: [1-9]' "$LOGS/$name.log")" = 0 ] && ok=1
  verdict "$name" $ok "compute-sanitizer memcheck on kill ($n ranks): $clean clean summaries, rc=$RC, $(secs_since "$t0")s"
  grep -hE "ERROR SUMMARY|RESULT" "$LOGS/$name.log" | head -6 | indent
}

step() { # NAME:N
  local what=${1%%:*} n=${1##*:}
  case $what in
    matrix|groups|seed|levels) scenario "$what" "$n" ;;
    checked) CHORUS_CHECK_OPS=1 scenario checked "$n" ;;
    trainer) trainer "$n" ;;
    torchrun) torchrun_matrix "$n" ;;
    tp_mlp) tp_mlp "$n" ;;
    kill-fresh) fault "kill-fresh-$n" "$n" kill PeerLost CHORUS_NCCL_REFORM=fresh ;;
    kill-shrink) fault "kill-shrink-$n" "$n" kill PeerLost CHORUS_NCCL_REFORM=shrink ;;
    kill-pip-fresh) pip_fault "kill-pip-fresh-$n" "$n" fresh kill PeerLost ;;
    kill-pip-shrink) pip_fault "kill-pip-shrink-$n" "$n" shrink kill PeerLost ;;
    stop-pip-fresh) pip_fault "stop-pip-fresh-$n" "$n" fresh stop PeerSilent ;;
    stop-pip-shrink) pip_fault "stop-pip-shrink-$n" "$n" shrink stop PeerSilent ;;
    stop) fault "stop-$n" "$n" stop PeerSilent ;;
    rejoin) rejoin "$n" ;;
    trainer-ft) trainer_ft "$n" ;;
    memcheck) memcheck "$n" ;;
    *) say "unknown step $1" ;;
  esac
}

if [ -z "${STEPS:-}" ]; then
  MAX=0
  for n in $RANKS; do
    [ "$n" -gt "$MAX" ] && MAX=$n
    STEPS="${STEPS:-} matrix:$n groups:$n seed:$n levels:$n trainer:$n"
  done
  echo " $RANKS " | grep -q " 2 " && STEPS="$STEPS torchrun:2 tp_mlp:2 checked:2"
  [ "$MAX" -ge 3 ] && STEPS="$STEPS kill-fresh:$MAX kill-shrink:$MAX kill-pip-fresh:$MAX kill-pip-shrink:$MAX stop:$MAX stop-pip-shrink:$MAX rejoin:$MAX trainer-ft:$MAX memcheck:2"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUM"
say "N ranks on one GPU: correctness only (chorus-run --share-gpu; timings mean nothing); steps:$STEPS"
for s in $STEPS; do step "$s"; done
say "N ranks on one GPU: correctness only — $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
