#!/usr/bin/env python3
"""chorus's TCP backend beside PyTorch's Gloo, all_reduce f32, in one run.

Builds nothing: run `cargo build --release -p chorus-benches -p chorus-runtime`
first (benches/compare/run.sh does). Prints a markdown table with ratios and
the targets of issue 3 (latency <= 1/5 of Gloo's for small messages; 16 MiB
bus bandwidth >= 2x Gloo's).

    python3 benches/compare/tcp_vs_gloo.py --ranks 2,4 --sizes 4,65536,16777216
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    rows = []
    for line in out.stdout.splitlines():
        line = line.split("] ", 1)[-1] if line.startswith("[rank") else line
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4,65536,16777216")
    ap.add_argument("--budget-s", default="3")
    a = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    run = os.path.join(target, "release", "chorus-run")
    bench = os.path.join(target, "release", "tcp_allreduce")
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch is not installed: Gloo side skipped (pip install torch)", file=sys.stderr)
    print("| ranks | bytes | chorus median µs | gloo median µs | latency ratio (gloo/chorus) | chorus busbw GB/s | gloo busbw GB/s | busbw ratio | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.ranks.split(",")]:
        ours = run_json([run, "--nproc-per-node", str(n), "--", bench, "--sizes", a.sizes, "--budget-s", a.budget_s])
        theirs = []
        if have_torch:
            theirs = run_json([sys.executable, os.path.join(ROOT, "benches/compare/gloo_allreduce.py"),
                               "--ranks", str(n), "--sizes", a.sizes, "--budget-s", a.budget_s])
        by_size = {r["bytes"]: r for r in theirs}
        for o in ours:
            g = by_size.get(o["bytes"])
            small = o["bytes"] <= 65536
            if g:
                lat_ratio = g["median_us"] / o["median_us"]
                bw_ratio = o["busbw_gbps"] / g["busbw_gbps"] if g["busbw_gbps"] else float("inf")
                tgt = ">= 5x lower latency" if small else ">= 2x busbw"
                met = (lat_ratio >= 5) if small else (bw_ratio >= 2)
                print(f"| {n} | {o['bytes']} | {o['median_us']} | {g['median_us']} | {lat_ratio:.1f}x | {o['busbw_gbps']} | {g['busbw_gbps']} | {bw_ratio:.2f}x | {tgt} | {'yes' if met else 'NO'} |")
            else:
                print(f"| {n} | {o['bytes']} | {o['median_us']} | - | - | {o['busbw_gbps']} | - | - | - | - |")


if __name__ == "__main__":
    main()
