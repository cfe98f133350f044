#!/usr/bin/env bash
# Where the host time of grouped and one-by-one ops goes, by function:
# `perf record --call-graph dwarf` of one group_probe layer at a time,
# folded into inclusive and self shares under the timed loop, with the
# caller chains of the driver's locks, the allocator, page faults and
# clock reads (fold-perf.py). Needs perf_event_open on the GPU machine (it was
# allowed there; `perf_event_paranoid` is printed first).
#
#   bash .gpu/run.sh [LAYER ...]        (default: g4 s4; ITERS=100000)
set -u
D=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
: "${OUT:=/tmp/out}"; mkdir -p "$OUT"
ITERS=${ITERS:-100000}
echo "perf_event_paranoid: $(cat /proc/sys/kernel/perf_event_paranoid)"
LAYERS=("$@"); [ ${#LAYERS[@]} -eq 0 ] && LAYERS=(g4 s4)
for L in "${LAYERS[@]}"; do
  echo "=== $L"
  LD_LIBRARY_PATH="$D/perf/lib" "$D/perf/perf" record -q -F 4999 --call-graph dwarf,8192 \
    -o "/tmp/$L.perf" "$D/bin/group_probe" --iters "$ITERS" --layers "$L" 2>&1 | grep ' us$'
  LD_LIBRARY_PATH="$D/perf/lib" "$D/perf/perf" script -i "/tmp/$L.perf" -F ip,sym 2>/dev/null \
    | python3 "$D/fold-perf.py" --under group_probe::layer \
        --callers exc_page_fault --callers malloc --callers calloc --callers pthread_mutex_lock \
        --callers clock_gettime > "$OUT/$L.fold.txt"
  head -40 "$OUT/$L.fold.txt"
  rm -f "/tmp/$L.perf"
done
