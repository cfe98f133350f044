#!/usr/bin/env bash
# Builds the release executables of the GPU suite and copies them, with
# the scripts they need, into one folder that runs on any Linux host with
# an NVIDIA GPU and its driver (no Rust toolchain needed there):
#
#   bash benches/gpu/pack.sh DIR [MODE...]      # here, where the toolchain is
#   bash DIR/run.sh --out RESULTS_DIR [MODE...] # there (copy DIR over first)
#
# MODE as for run.sh (default: every mode but candle); the folder holds
# what those modes run:
#
#   DIR/run.sh, DIR/run-multirank.sh   the scripts
#   DIR/bin/                           stripped executables and test binaries
#   DIR/compare/                       the PyTorch comparison scripts
#   DIR/RESULTS.md                     benches/RESULTS.md, for `bench` to update
#   DIR/COMMIT                         the commit the executables were built from
#
# `candle` builds the candle adapter's GPU test and tp_mlp example too; it
# needs a CUDA toolkit, which .ci/cuda-toolkit.sh installs from PyPI into
# the Python environment TORCH_VENV names (default
# ~/.cache/chorus-ci/torch-2.11, a venv with PyTorch). Executables over
# 16 MiB (candle's, with their CUDA kernels) are packed xz-compressed and
# unpacked by run.sh. The target folder is CARGO_TARGET_DIR (default
# target/); the adapter's, CHORUS_ADAPTER_TARGET_DIR.
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash benches/gpu/pack.sh DIR [MODE...]  (modes: bash benches/gpu/run.sh --help)" >&2
  exit 2
fi
DIR=$1; shift
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$(git -C "$HERE" rev-parse --show-toplevel)"
MODES=("$@"); [ ${#MODES[@]} -eq 0 ] && MODES=(all)
has() { local m; for m in "${MODES[@]}"; do [ "$m" = "$1" ] || { [ "$m" = all ] && [ "$1" != candle ]; } && return 0; done; return 1; }

json=$(mktemp); trap 'rm -f "$json"' EXIT
WANT=()
tests=(); benches=(); examples=(); ranks=()
if has tests || has sanitize; then
  tests+=(-p chorus --test nccl_gpu --test batches_gpu --test watchdog_gpu --test wake_gpu --test foreign_buffer_gpu
          -p nccl-sys --test gpu -p chorus-gpu --test cuda -p chorus-examples --test gpu_trainer_gpu)
  WANT+=(nccl_gpu batches_gpu watchdog_gpu wake_gpu foreign_buffer_gpu gpu cuda gpu_trainer_gpu)
fi
if has multirank; then
  ranks+=(--bin chorus-gpu-rank); examples+=(--example gpu_trainer)
  WANT+=(chorus-gpu-rank gpu_trainer)
fi
if has trainer; then
  examples+=(--example gpu_trainer); WANT+=(gpu_trainer)
  if ! has tests; then tests+=(-p chorus-examples --test gpu_trainer_gpu); WANT+=(gpu_trainer_gpu); fi
fi
if has torchrun; then examples+=(--example quickstart --example async_trainer); WANT+=(quickstart async_trainer); fi
if has wake; then benches+=(--bin wake_probe); WANT+=(wake_probe); fi
if has nccl || has checked; then benches+=(--bin nccl_bench --bin group_bench); WANT+=(nccl_bench group_bench); fi
if has watchdog; then benches+=(--bin watchdog_overhead); WANT+=(watchdog_overhead); fi
if has bench; then
  benches+=(--bin chorus-bench --bin tcp_allreduce --bin store_compare --bin pingpong --bin nccl_bench --bin group_bench)
  WANT+=(chorus-bench tcp_allreduce store_compare pingpong nccl_bench group_bench)
fi
WANT+=(chorus-run)

: > "$json"
[ ${#tests[@]} -gt 0 ] && cargo test --release --no-run --message-format=json "${tests[@]}" >> "$json"
[ ${#benches[@]} -gt 0 ] && cargo build --release --message-format=json -p chorus-benches "${benches[@]}" >> "$json"
[ ${#examples[@]} -gt 0 ] && cargo build --release --message-format=json -p chorus-examples "${examples[@]}" >> "$json"
[ ${#ranks[@]} -gt 0 ] && cargo build --release --message-format=json -p tests-integration "${ranks[@]}" >> "$json"
cargo build --release --message-format=json -p chorus-launcher --bin chorus-run >> "$json"
if has candle; then
  # The adapter's GPU test is named gpu too: it is packed as gpu-candle.
  ( export TORCH_VENV="${TORCH_VENV:-$HOME/.cache/chorus-ci/torch-2.11}"
    . .ci/cuda-toolkit.sh
    cd adapters/candle
    export CARGO_TARGET_DIR="${CHORUS_ADAPTER_TARGET_DIR:-$PWD/target}"
    cargo test --release --locked --test gpu --no-run --message-format=json \
      | sed 's/"name":"gpu"/"name":"gpu-candle"/'
    cargo build --release --locked --example tp_mlp --message-format=json ) >> "$json"
  WANT+=(gpu-candle tp_mlp)
fi

rm -rf "$DIR/bin" "$DIR/compare" && mkdir -p "$DIR/bin" "$DIR/compare"
python3 - "$json" "$DIR" "${WANT[@]}" <<'PY'
import json, os, shutil, subprocess, sys
path, d, want = sys.argv[1], sys.argv[2], set(sys.argv[3:])
for line in open(path):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") != "compiler-artifact" or not exe:
        continue
    name = m["target"]["name"]
    if name not in want:
        continue
    dst = os.path.join(d, "bin", name)
    shutil.copy2(exe, dst)
    subprocess.run(["strip", dst], check=False)
    if os.path.getsize(dst) > 16 << 20:
        subprocess.run(["xz", "-T2", "-6", "-f", dst], check=True)
        dst += ".xz"
    print(f"packed {name} ({os.path.getsize(dst) >> 20} MiB)")
PY
cp "$HERE/run.sh" "$HERE/run-multirank.sh" "$DIR/"
cp benches/compare/*.py "$DIR/compare/"
cp benches/RESULTS.md "$DIR/RESULTS.md"
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . ':(exclude)benches/RESULTS.md' ':(exclude)benches/plots' || commit="$commit+changes"
echo "$commit" > "$DIR/COMMIT"
echo "packed commit $commit into $DIR ($(du -sh "$DIR" | cut -f1)); on the GPU host: bash $(basename "$DIR")/run.sh --out RESULTS_DIR ${MODES[*]}"
