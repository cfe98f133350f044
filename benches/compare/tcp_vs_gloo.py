#!/usr/bin/env python3
"""chorus's TCP backend beside PyTorch's Gloo, all_reduce f32, in one run.

Builds nothing: run `cargo build --release -p chorus-benches -p chorus-launcher`
first (benches/run.sh does). Prints a markdown table with ratios and
the targets (latency <= 1/5 of Gloo's for small messages; 16 MiB
bus bandwidth >= 2x Gloo's).

Each side runs `--repeat` times, alternating (chorus, Gloo, chorus, ...), so
that both see the same background load; the table holds the median of the
runs' medians, and the load average (1 min) before and after.

    nice -n -20 python3 benches/compare/tcp_vs_gloo.py --ranks 2,4 --sizes 4,65536,16777216 --repeat 3
"""
import argparse
import json
import os
import statistics
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


def by_size(runs):
    """{bytes: (median of median_us, median of busbw, [median_us per run])}"""
    sizes = {}
    for rows in runs:
        for r in rows:
            sizes.setdefault(r["bytes"], []).append(r)
    return {
        b: (
            statistics.median(x["median_us"] for x in rs),
            statistics.median(x["busbw_gbps"] for x in rs),
            [x["median_us"] for x in rs],
        )
        for b, rs in sizes.items()
    }


def fmt_runs(v):
    return "/".join(f"{x:.0f}" if x >= 100 else f"{x:.1f}" for x in v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4,65536,16777216")
    ap.add_argument("--budget-s", default="3")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side (median reported)")
    ap.add_argument("--bench", default=None, help="tcp_allreduce binary (default: target/release)")
    a = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    run = os.path.join(target, "release", "chorus-run")
    bench = a.bench or os.path.join(target, "release", "tcp_allreduce")
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch is not installed: Gloo side skipped (pip install torch)", file=sys.stderr)
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; niceness {os.nice(0)}; {a.repeat} runs per side")
    print()
    print("| ranks | bytes | chorus median µs (runs) | gloo median µs (runs) | latency ratio (gloo/chorus) | chorus busbw GB/s | gloo busbw GB/s | busbw ratio | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.ranks.split(",")]:
        ours_runs, theirs_runs = [], []
        for _ in range(a.repeat):
            ours_runs.append(run_json([run, "--nproc-per-node", str(n), "--", bench, "--sizes", a.sizes,
                                       "--budget-s", a.budget_s]))
            if have_torch:
                theirs_runs.append(run_json([sys.executable, os.path.join(ROOT, "benches/compare/gloo_allreduce.py"),
                                             "--ranks", str(n), "--sizes", a.sizes, "--budget-s", a.budget_s]))
        ours, theirs = by_size(ours_runs), by_size(theirs_runs)
        for b in sorted(ours):
            o_med, o_bw, o_runs = ours[b]
            g = theirs.get(b)
            small = b <= 65536
            if g:
                g_med, g_bw, g_runs = g
                lat_ratio = g_med / o_med
                # Same bytes and ranks: the bandwidth ratio is the time ratio
                # (the rounded busbw of tiny messages is 0).
                bw_ratio = lat_ratio
                tgt = ">= 5x lower latency" if small else ">= 2x busbw"
                met = (lat_ratio >= 5) if small else (bw_ratio >= 2)
                print(f"| {n} | {b} | {o_med:.1f} ({fmt_runs(o_runs)}) | {g_med:.1f} ({fmt_runs(g_runs)}) | {lat_ratio:.2f}x | {o_bw} | {g_bw} | {bw_ratio:.2f}x | {tgt} | {'yes' if met else 'NO'} |")
            else:
                print(f"| {n} | {b} | {o_med:.1f} ({fmt_runs(o_runs)}) | - | - | {o_bw} | - | - | - | - |")
        sys.stdout.flush()
    load1 = os.getloadavg()
    print()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
