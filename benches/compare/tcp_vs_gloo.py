#!/usr/bin/env python3
"""chorus's TCP backend beside PyTorch's Gloo, all_reduce f32, in one run,
with the machine's floor: a blocking ping-pong of the same bytes over an
abstract Unix socket (what local ranks use) and loopback TCP (`pingpong`).

Builds nothing: run `cargo build --release -p chorus-benches -p chorus-launcher`
first (benches/run.sh does). Prints a markdown table with ratios and
the targets (small messages: latency <= 1/5 of Gloo's, and with 2 ranks
<= 2x the Unix ping-pong; 16 MiB bus bandwidth >= 2x Gloo's) and the
spread of chorus's medians over the runs (max / min; target <= 1.5).

Each side runs `--repeat` times, alternating (floor, chorus, Gloo, floor,
chorus, ...), so that all see the same background load; the table holds
the median of the runs' medians, and the load average (1 min) before and
after. The floor column also shows a ping-pong in which both sides spin
instead of sleeping (`unix-spin`): the floor of an exchange with no
wake-up at all. `--base BIN` runs another build's `tcp_allreduce` in
the same rotation (a column of its own), to compare two builds in one
run.

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


def floor_by_size(runs):
    """{(transport, bytes): median of the runs' ping-pong medians}"""
    acc = {}
    for rows in runs:
        for r in rows:
            acc.setdefault((r["transport"], r["bytes"]), []).append(r["median_us"])
    return {k: statistics.median(v) for k, v in acc.items()}


def fmt_runs(v):
    return "/".join(f"{x:.0f}" if x >= 100 else f"{x:.1f}" for x in v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4,65536,16777216")
    ap.add_argument("--budget-s", default="3")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side (median reported)")
    ap.add_argument("--bench", default=None, help="tcp_allreduce binary (default: target/release)")
    ap.add_argument("--base", default=None, help="another build's tcp_allreduce, run in the same rotation")
    a = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    run = os.path.join(target, "release", "chorus-run")
    bench = a.bench or os.path.join(target, "release", "tcp_allreduce")
    pingpong = os.path.join(os.path.dirname(bench), "pingpong")
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch is not installed: Gloo side skipped (pip install torch)", file=sys.stderr)
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; niceness {os.nice(0)}; {a.repeat} runs per side")
    print()
    base_col = " base median µs (runs) |" if a.base else ""
    print(f"| ranks | bytes | floor unix / tcp / unix spinning µs | chorus median µs (runs) | spread | chorus / floor |{base_col} gloo median µs (runs) | latency ratio (gloo/chorus) | chorus busbw GB/s | gloo busbw GB/s | busbw ratio | target | met |")
    print("|---|---|---|---|---|---|" + ("---|" if a.base else "") + "---|---|---|---|---|---|---|")
    small_sizes = ",".join(s for s in a.sizes.split(",") if int(s) <= 65536) or "4"
    for n in [int(x) for x in a.ranks.split(",")]:
        ours_runs, theirs_runs, floor_runs, base_runs = [], [], [], []
        for _ in range(a.repeat):
            floor_runs.append(run_json([pingpong, "--sizes", a.sizes, "--budget-s", "1"]))
            floor_runs.append(run_json([pingpong, "--transports", "unix-spin", "--sizes", small_sizes,
                                        "--budget-s", "1"]))
            ours_runs.append(run_json([run, "--nproc-per-node", str(n), "--", bench, "--sizes", a.sizes,
                                       "--budget-s", a.budget_s]))
            if a.base:
                base_runs.append(run_json([run, "--nproc-per-node", str(n), "--", a.base, "--sizes", a.sizes,
                                           "--budget-s", a.budget_s]))
            if have_torch:
                theirs_runs.append(run_json([sys.executable, os.path.join(ROOT, "benches/compare/gloo_allreduce.py"),
                                             "--ranks", str(n), "--sizes", a.sizes, "--budget-s", a.budget_s]))
        ours, theirs, base = by_size(ours_runs), by_size(theirs_runs), by_size(base_runs)
        floor = floor_by_size(floor_runs)
        for b in sorted(ours):
            o_med, o_bw, o_runs = ours[b]
            fu, ft, fs = floor.get(("unix", b)), floor.get(("tcp", b)), floor.get(("unix-spin", b))
            floor_cell = f"{fu:.1f} / {ft:.1f}" if fu and ft else "-"
            floor_cell += f" / {fs:.1f}" if fs else " / -"
            base_cell = ""
            if a.base:
                bm = base.get(b)
                base_cell = f" {bm[0]:.1f} ({fmt_runs(bm[2])}) |" if bm else " - |"
            vs_floor = f"{o_med / fu:.2f}x" if fu else "-"
            spread = max(o_runs) / min(o_runs) if min(o_runs) > 0 else float("nan")
            g = theirs.get(b)
            small = b <= 65536
            if g:
                g_med, g_bw, g_runs = g
                lat_ratio = g_med / o_med
                # Same bytes and ranks: the bandwidth ratio is the time ratio
                # (the rounded busbw of tiny messages is 0).
                bw_ratio = lat_ratio
                if small and n == 2:
                    tgt = ">= 5x lower latency, <= 2x floor"
                    met = lat_ratio >= 5 and fu is not None and o_med <= 2 * fu
                elif small:
                    tgt = ">= 5x lower latency"
                    met = lat_ratio >= 5
                else:
                    tgt = ">= 2x busbw"
                    met = bw_ratio >= 2
                print(f"| {n} | {b} | {floor_cell} | {o_med:.1f} ({fmt_runs(o_runs)}) | {spread:.2f} | {vs_floor} |{base_cell} {g_med:.1f} ({fmt_runs(g_runs)}) | {lat_ratio:.2f}x | {o_bw} | {g_bw} | {bw_ratio:.2f}x | {tgt} | {'yes' if met else 'NO'} |")
            else:
                print(f"| {n} | {b} | {floor_cell} | {o_med:.1f} ({fmt_runs(o_runs)}) | {spread:.2f} | {vs_floor} |{base_cell} - | - | {o_bw} | - | - | - | - |")
        sys.stdout.flush()
    load1 = os.getloadavg()
    print()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
