#!/usr/bin/env bash
# Builds the benchmark binaries in release, then runs every suite this
# machine can run (chorus-bench) and rewrites their sections of
# benches/RESULTS.md and the plots in benches/plots/:
#
#   bash benches/run.sh [--quick] [--suites store,tcp,checked,nccl] [chorus-bench args...]
#
# (`target/release/chorus-bench --help` lists the arguments; benches/README.md
# says what each suite measures.) The PyTorch anchors run when
# `python3 -c "import torch"` works; the NCCL suite when a GPU is present.
# On a shared machine, run it under `nice -n -20`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p chorus-benches -p chorus-launcher
exec "${CARGO_TARGET_DIR:-target}/release/chorus-bench" "$@"
