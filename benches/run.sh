#!/usr/bin/env bash
# Builds the benchmark binaries in release, then runs every comparison this
# machine allows and writes benches/RESULTS.md and benches/plots/:
#
#   bash benches/run.sh [--quick] [chorus-bench args...]
#
# (`target/release/chorus-bench --help` lists the arguments.) The PyTorch
# anchors run when `python3 -c "import torch"` works; the NCCL comparison
# when a GPU is present. On a shared machine, run it under `nice -n -20`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p chorus-benches -p chorus-launcher
exec "${CARGO_TARGET_DIR:-target}/release/chorus-bench" "$@"
