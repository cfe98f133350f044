#!/usr/bin/env bash
# Builds (release) and packs the executables of one GPU run into a
# git-excluded folder that the device tool carries; the run script goes
# with them as run.sh.
#
#   bash benches/gpu/pack.sh groups    # run-groups.sh: grouped-ops tests, group_bench, torch_coalesce, nccl_bench
#   bash benches/gpu/pack.sh session   # run-session.sh: GPU trainer, watchdog test and overhead, groups test
#   bash benches/gpu/pack.sh bench     # run-bench.sh: the full chorus-bench run, every comparison
#   bash benches/gpu/pack.sh nccl      # run-nccl.sh: the 1-rank NCCL GPU tests, then run-multirank.sh (N ranks on one GPU:
#                                      #   every scenario of chorus-gpu-rank, the GPU trainer, faults), the 2-GPU scenarios
#                                      #   (WITH_CANDLE=1: the candle adapter's tp_mlp too; TORCH_VENV as for ecosystem)
#   bash benches/gpu/pack.sh probe     # run-probe.sh: every GPU test, compute-sanitizer, enqueue_probe, nccl_bench A/B
#   bash benches/gpu/pack.sh wake      # run-wake.sh: GPU tests, wake_probe, torch_wake.py, group_bench (profiled), nccl_bench, watchdog overhead, round trips A/B
#   bash benches/gpu/pack.sh trainer   # run-trainer.sh: gpu_trainer (and its GPU test) beside torch_ddp.py, small and large MLP
#   bash benches/gpu/pack.sh profile   # run-profile.sh: group_probe layers under perf (perf and its libraries carried), folded by function
#   bash benches/gpu/pack.sh ecosystem # run-ecosystem.sh: every GPU test, the candle adapter, torchrun, nccl_bench A/B
#                                      #   (builds the adapter with .ci/cuda-toolkit.sh: TORCH_VENV names a venv with PyTorch)
#
# Each packs into .gpu/ (git-ignored; one pack at a time) with its run
# script as .gpu/run.sh: carry [".gpu"] and run `bash .gpu/run.sh [MODE]`.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
json=$(mktemp)
case "${1:-}" in
groups)
  D=.gpu; RUN=benches/gpu/run-groups.sh
  WANT="groups_gpu nccl_gpu group_bench nccl_bench"
  cargo test --release -p chorus --test groups_gpu --test nccl_gpu --no-run --message-format=json > "$json"
  cargo build --release -p chorus-benches --bin group_bench --bin nccl_bench --message-format=json >> "$json"
  ;;
session)
  D=.gpu; RUN=benches/gpu/run-session.sh
  WANT="groups_gpu watchdog_gpu watchdog_overhead async_trainer chorus-run"
  cargo test --release -p chorus --test groups_gpu --test watchdog_gpu --no-run --message-format=json > "$json"
  cargo build --release -p chorus-benches --bin watchdog_overhead --message-format=json >> "$json"
  cargo build --release -p chorus-examples --example async_trainer --message-format=json >> "$json"
  cargo build --release -p chorus-launcher --bin chorus-run --message-format=json >> "$json"
  ;;
nccl)
  D=.gpu; RUN=benches/gpu/run-nccl.sh
  WANT="${WANT:-gpu groups_gpu nccl_gpu watchdog_gpu chorus-gpu-rank chorus-run gpu_trainer}"
  cargo test --release -p chorus --test groups_gpu --test nccl_gpu --test watchdog_gpu --no-run --message-format=json > "$json"
  cargo test --release -p nccl-sys --test gpu --no-run --message-format=json >> "$json"
  cargo build --release -p chorus-examples --bin chorus-gpu-rank --example gpu_trainer --message-format=json >> "$json"
  cargo build --release -p chorus-launcher --bin chorus-run --message-format=json >> "$json"
  EXTRA=benches/gpu/run-multirank.sh
  # WITH_CANDLE=1: the candle adapter's tp_mlp too (a CUDA toolkit from
  # .ci/cuda-toolkit.sh, as for `ecosystem`).
  if [ -n "${WITH_CANDLE:-}" ]; then
    WANT="$WANT tp_mlp"
    ( export TORCH_VENV="${TORCH_VENV:-$HOME/.cache/chorus-ci/torch-2.11}"
      . .ci/cuda-toolkit.sh
      cd adapters/candle
      export CARGO_TARGET_DIR="${CHORUS_ADAPTER_TARGET_DIR:-$PWD/target}"
      cargo build --release --locked --example tp_mlp --message-format=json ) >> "$json"
  fi
  ;;
probe)
  D=.gpu; RUN=benches/gpu/run-probe.sh
  WANT="enqueue_probe nccl_bench group_bench nccl_gpu watchdog_gpu groups_gpu gpu cuda async_trainer chorus-run"
  cargo test --release -p chorus --test nccl_gpu --test watchdog_gpu --test groups_gpu --no-run --message-format=json > "$json"
  cargo test --release -p nccl-sys --test gpu -p chorus-gpu --test cuda --no-run --message-format=json >> "$json"
  cargo build --release -p chorus-benches --bin enqueue_probe --bin nccl_bench --bin group_bench --message-format=json >> "$json"
  cargo build --release -p chorus-examples --example async_trainer --message-format=json >> "$json"
  cargo build --release -p chorus-launcher --bin chorus-run --message-format=json >> "$json"
  ;;
wake)
  D=.gpu; RUN=benches/gpu/run-wake.sh
  WANT="wake_probe group_bench group_probe nccl_bench watchdog_overhead nccl_gpu wake_gpu watchdog_gpu groups_gpu foreign_buffer_gpu gpu cuda"
  cargo build --release -p chorus-benches --bin wake_probe --bin group_bench --bin group_probe --bin nccl_bench --bin watchdog_overhead --message-format=json > "$json"
  cargo test --release -p chorus --test nccl_gpu --test wake_gpu --test watchdog_gpu --test groups_gpu --test foreign_buffer_gpu --no-run --message-format=json >> "$json"
  cargo test --release -p nccl-sys --test gpu -p chorus-gpu --test cuda --no-run --message-format=json >> "$json"
  ;;
ecosystem)
  D=.gpu; RUN=benches/gpu/run-ecosystem.sh
  WANT="nccl_bench nccl_gpu watchdog_gpu groups_gpu foreign_buffer_gpu gpu cuda async_trainer quickstart chorus-run gpu-candle tp_mlp"
  cargo test --release -p chorus --test nccl_gpu --test watchdog_gpu --test groups_gpu --test foreign_buffer_gpu --no-run --message-format=json > "$json"
  cargo test --release -p nccl-sys --test gpu -p chorus-gpu --test cuda --no-run --message-format=json >> "$json"
  cargo build --release -p chorus-benches --bin nccl_bench --message-format=json >> "$json"
  cargo build --release -p chorus-examples --example async_trainer --example quickstart --message-format=json >> "$json"
  cargo build --release -p chorus-launcher --bin chorus-run --message-format=json >> "$json"
  # The adapter's GPU test is named gpu too: it is packed as gpu-candle.
  ( export TORCH_VENV="${TORCH_VENV:-$HOME/.cache/chorus-ci/torch-2.11}"
    . .ci/cuda-toolkit.sh
    cd adapters/candle
    export CARGO_TARGET_DIR="${CHORUS_ADAPTER_TARGET_DIR:-$PWD/target}"
    cargo test --release --locked --test gpu --no-run --message-format=json \
      | sed 's/"name":"gpu"/"name":"gpu-candle"/'
    cargo build --release --locked --example tp_mlp --message-format=json ) >> "$json"
  ;;
profile)
  D=.gpu; RUN=benches/gpu/run-profile.sh
  WANT="group_probe"
  # Symbols kept: perf names the functions.
  KEEP_SYMBOLS=1
  cargo build --release -p chorus-benches --bin group_probe --message-format=json > "$json"
  ;;
trainer)
  D=.gpu; RUN=benches/gpu/run-trainer.sh
  WANT="gpu_trainer gpu_trainer_gpu chorus-run"
  cargo build --release -p chorus-examples --example gpu_trainer --message-format=json > "$json"
  cargo test --release -p chorus-examples --test gpu_trainer_gpu --no-run --message-format=json >> "$json"
  cargo build --release -p chorus-launcher --bin chorus-run --message-format=json >> "$json"
  ;;
bench)
  D=.gpu; RUN=benches/gpu/run-bench.sh
  WANT="chorus-bench chorus-run tcp_allreduce store_compare nccl_bench group_bench"
  cargo build --release -p chorus-benches -p chorus-launcher --message-format=json > "$json"
  ;;
*)
  echo "usage: bash benches/gpu/pack.sh groups|session|nccl|probe|wake|profile|trainer|ecosystem|bench" >&2; exit 2 ;;
esac
rm -rf "$D" && mkdir -p "$D/bin"
KEEP_SYMBOLS=${KEEP_SYMBOLS:-} python3 - "$json" "$D" $WANT <<'PY'
import json, shutil, subprocess, sys, os
path, d, want = sys.argv[1], sys.argv[2], set(sys.argv[3:])
keep = bool(os.environ.get("KEEP_SYMBOLS"))
for line in open(path):
    try: m = json.loads(line)
    except ValueError: continue
    exe = m.get("executable")
    if m.get("reason") != "compiler-artifact" or not exe: continue
    t = m["target"]["name"]
    if t not in want: continue
    dst = os.path.join(d, "bin", t)
    shutil.copy2(exe, dst)
    if not keep: subprocess.run(["strip", dst], check=False)
    # Binaries that embed CUDA kernels (candle's) travel compressed.
    if os.path.getsize(dst) > 16 << 20:
        subprocess.run(["xz", "-T2", "-6", "-f", dst], check=True)
        dst += ".xz"
    print("packed", t, os.path.getsize(dst) >> 20, "MiB")
PY
cp benches/compare/torch_coalesce.py benches/compare/torch_nccl.py "$D/"
mkdir -p "$D/compare" && cp benches/compare/*.py benches/compare/*.sh benches/compare/*.cu benches/compare/*.h "$D/compare/"
if [ -n "${KEEP_SYMBOLS:-}" ]; then
  # perf with the libraries it links, but the C runtime's (the GPU
  # machine's own are newer); the fold script beside it.
  perf=$(command -v perf) || { echo "perf is not installed here (apt install linux-perf)" >&2; exit 1; }
  mkdir -p "$D/perf/lib" && cp "$perf" "$D/perf/"
  ldd "$perf" | awk '$3 ~ /^\// {print $3}' \
    | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' \
    | xargs -r -I{} cp -L {} "$D/perf/lib/"
  cp benches/gpu/fold-perf.py "$D/"
fi
cp "$RUN" "$D/run.sh"
[ -n "${EXTRA:-}" ] && cp $EXTRA "$D/"
du -sh "$D"
