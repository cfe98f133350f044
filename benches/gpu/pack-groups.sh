#!/usr/bin/env bash
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
json=$(mktemp)
cargo test --release -p chorus --test groups_gpu --test nccl_gpu --no-run --message-format=json > "$json"
cargo build --release -p chorus-benches --bin group_bench --bin nccl_bench --message-format=json >> "$json"
D=$PWD/.gpu-g7
rm -rf $D && mkdir -p $D/bin
python3 - "$json" $D <<'PY'
import json, shutil, subprocess, sys, os
path, d = sys.argv[1], sys.argv[2]
for line in open(path):
    try: m = json.loads(line)
    except ValueError: continue
    exe = m.get("executable")
    if m.get("reason") != "compiler-artifact" or not exe: continue
    t = m["target"]["name"]
    if t not in ("groups_gpu","nccl_gpu","group_bench","nccl_bench"): continue
    dst = os.path.join(d, "bin", t)
    shutil.copy2(exe, dst); subprocess.run(["strip", dst], check=False)
    print("packed", t)
PY
cp benches/compare/torch_coalesce.py benches/compare/torch_nccl.py $D/
cp benches/gpu/run-groups.sh $D/run.sh
grep -qx "/.gpu-g7/" .git/info/exclude || echo "/.gpu-g7/" >> .git/info/exclude
du -sh $D
