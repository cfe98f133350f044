#!/usr/bin/env bash
# Store round trips, chorus beside PyTorch's TCPStore, in one run.
#
#   bash benches/compare/store.sh [SECONDS]     (default 2 s per figure)
#
# Prints ops/s for set, get and add of 64-byte values over loopback:
# chorus (target/release/store_compare) and then PyTorch
# (benches/compare/torch_store.py, skipped with a note if torch is not
# installed). The criterion bench of the same workload is
# `cargo bench -p chorus-benches --bench store`.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-2}"
cargo build --release -q -p chorus-benches --bin store_compare
echo "## chorus"
target/release/store_compare "$secs"
echo "## pytorch"
if python3 -c "import torch" 2>/dev/null; then
  python3 benches/compare/torch_store.py --seconds "$secs" --clients 1,16 2>&1 | grep -v -i warn
else
  echo "torch is not installed (pip install torch): no PyTorch figures"
fi
