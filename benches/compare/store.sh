#!/usr/bin/env bash
# Store round trips, chorus beside PyTorch's TCPStore, in one run.
#
#   bash benches/compare/store.sh [SECONDS]     (default 2 s per figure)
#
# set, get and add of 64-byte values over loopback, server in the same
# process as the clients, each op awaited before the next (per client or
# per in-flight slot): chorus (target/release/store_compare), then PyTorch
# (benches/compare/torch_store.py; skipped with a note if torch is not
# installed), then one table of ops/s and ratios, with the machine's floor
# (a blocking loopback TCP ping-pong of 64 bytes, `pingpong`, as round
# trips per second) measured first in the same call. Run it under `nice -n -20`
# on a shared machine. The criterion bench of the same workload is
# `cargo bench -p chorus-benches --bench store`.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-2}"
cargo build --release -q -p chorus-benches --bin store_compare --bin pingpong
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
# The floor: a blocking loopback TCP ping-pong of a request's size.
target/release/pingpong --transports tcp --sizes 64 --budget-s "$secs" \
  | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print("floor", "rtt", "1", round(1e6 / r["median_us"]))' \
  | tee -a "$out"
target/release/store_compare "$secs" | tee -a "$out"
if python3 -c "import torch" 2>/dev/null; then
  python3 benches/compare/torch_store.py --seconds "$secs" --clients 1,16 2>&1 \
    | grep -v -i warn | tee -a "$out"
else
  echo "torch is not installed (pip install torch): no PyTorch figures"
  exit 0
fi
python3 - "$out" <<'PY'
import sys
r = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and f[0] in ("chorus", "torch", "floor"):
        r[(f[0], f[1], f[2])] = float(f[3])
def k(x):
    return f"{x/1000:.1f}k" if x else "-"
cols = [("torch", "1"), ("chorus", "1"), ("chorus", "1x32"), ("chorus", "1x128"),
        ("torch", "16"), ("chorus", "16")]
print()
floor = r.get(("floor", "rtt", "1"), 0)
print()
print(f"floor: blocking loopback TCP ping-pong, 64 bytes: {k(floor)} round trips/s")
print("| op  | PyTorch 1 client | chorus 1 client | chorus 1 client / floor | chorus 1 client, 32 in flight | chorus 1 client, 128 in flight | PyTorch 16 clients | chorus 16 clients |")
print("|-----|---|---|---|---|---|---|---|")
for op in ("set", "get", "add"):
    t1, t16 = r.get(("torch", op, "1"), 0), r.get(("torch", op, "16"), 0)
    cells = []
    for impl, c in cols:
        v = r.get((impl, op, c), 0)
        base = t16 if c == "16" else t1
        cells.append(k(v) if impl == "torch" or not base else f"{k(v)} ({v/base:.1f}x)")
        if (impl, c) == ("chorus", "1"):
            cells.append(f"{floor / v:.2f}x the floor's time" if v and floor else "-")
    print(f"| {op} | " + " | ".join(cells) + " |")
print("\n(ratios: against PyTorch with the same number of clients; ops/s)")
PY
