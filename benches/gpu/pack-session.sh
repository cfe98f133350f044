#!/usr/bin/env bash
# Packs what benches/gpu/run-session.sh runs on the GPU machine into .gpu-s/
# (git-excluded): the GPU variant of the async trainer, chorus-run, the
# watchdog GPU test and overhead bench, the grouped-ops GPU test.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
json=$(mktemp)
cargo test --release -p chorus --test groups_gpu --test watchdog_gpu --no-run --message-format=json > "$json"
cargo build --release -p chorus-benches --bin watchdog_overhead --message-format=json >> "$json"
cargo build --release -p chorus-examples --example async_trainer --message-format=json >> "$json"
cargo build --release -p chorus-runtime --bin chorus-run --message-format=json >> "$json"
D=$PWD/.gpu-s
rm -rf "$D" && mkdir -p "$D/bin"
python3 - "$json" "$D" <<'PY'
import json, shutil, subprocess, sys, os
path, d = sys.argv[1], sys.argv[2]
want = {"groups_gpu", "watchdog_gpu", "watchdog_overhead", "async_trainer", "chorus-run"}
for line in open(path):
    try: m = json.loads(line)
    except ValueError: continue
    exe = m.get("executable")
    if m.get("reason") != "compiler-artifact" or not exe: continue
    t = m["target"]["name"]
    if t not in want: continue
    dst = os.path.join(d, "bin", t)
    shutil.copy2(exe, dst); subprocess.run(["strip", dst], check=False)
    print("packed", t)
PY
cp benches/gpu/run-session.sh "$D/run.sh"
grep -qx "/.gpu-s/" .git/info/exclude || echo "/.gpu-s/" >> .git/info/exclude
du -sh "$D"
