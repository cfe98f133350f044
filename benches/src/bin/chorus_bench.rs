//! chorus-bench: every comparison this machine allows, in one run, written
//! to benches/RESULTS.md with SVG plots.
//!
//! ```sh
//! cargo build --release -p chorus-benches -p chorus-launcher
//! target/release/chorus-bench [--quick] [--out benches/RESULTS.md] [--plots benches/plots]
//! ```
//!
//! (`bash benches/run.sh [ARGS]` does both.) It builds nothing: it runs the
//! sibling executables of its own target directory (`chorus-run`,
//! `tcp_allreduce`, `store_compare`, `nccl_bench`) and the PyTorch scripts
//! of `benches/compare/`:
//!
//! * the store: chorus's `TcpStore` beside PyTorch's `TCPStore`
//!   (`store_compare` and `torch_store.py`);
//! * the TCP backend beside Gloo: f32 all_reduce with 2 and 4 ranks,
//!   4 B to 64 MiB (`tcp_allreduce` under `chorus-run`, and
//!   `gloo_allreduce.py`);
//! * on a machine with an NVIDIA GPU, the NCCL backend beside PyTorch's
//!   ProcessGroupNCCL (`nccl_bench` and `torch_nccl.py`), and sequential vs
//!   grouped all_reduces beside raw NCCL calls and PyTorch's coalescing
//!   manager (`group_bench` and `torch_coalesce.py`).
//!
//! A comparison whose anchor cannot run (torch not installed, no GPU, a
//! binary not built) is reported with ours only and the reason it was
//! skipped. Each figure is the median over `--reps` runs, each run itself a
//! median over many iterations after a warm-up; the two sides of a ratio
//! run alternately within the same invocation. The report goes between the
//! markers `<!-- chorus-bench:begin -->` and `<!-- chorus-bench:end -->` of
//! the output file (appended when they are missing), so hand-written
//! sections elsewhere in the file stay.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use plotters::prelude::*;
use serde_json::Value;

const BEGIN: &str = "<!-- chorus-bench:begin -->";
const END: &str = "<!-- chorus-bench:end -->";
const BUILD_HINT: &str = "cargo build --release -p chorus-benches -p chorus-launcher";

#[derive(Parser, Debug)]
#[command(
    name = "chorus-bench",
    about = "Runs every benchmark comparison this machine allows and writes RESULTS.md and SVG plots"
)]
struct Args {
    /// Seconds instead of minutes: small sizes, 2 ranks, short budgets (the CI smoke run).
    #[arg(long)]
    quick: bool,
    /// The report file; the section between the chorus-bench markers is replaced.
    #[arg(long, default_value = "benches/RESULTS.md")]
    out: PathBuf,
    /// Folder for the SVG plots.
    #[arg(long, default_value = "benches/plots")]
    plots: PathBuf,
    /// Leave out the PyTorch anchors even when torch is installed.
    #[arg(long)]
    no_torch: bool,
    /// Runs of each measurement; figures are their median (default 3, quick 2).
    #[arg(long)]
    reps: Option<usize>,
    /// Rank counts of the TCP comparison (default 2,4; quick 2).
    #[arg(long, value_delimiter = ',')]
    ranks: Option<Vec<usize>>,
    /// Message sizes in bytes of the TCP comparison (default 4 B to 64 MiB).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Folder holding chorus-run, tcp_allreduce, store_compare, nccl_bench (default: this executable's).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Folder holding the PyTorch scripts (default: benches/compare of this checkout).
    #[arg(long)]
    compare_dir: Option<PathBuf>,
}

/// Knobs that differ between the full and the quick run.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    reps: usize,
    ranks: Vec<usize>,
    sizes: Vec<usize>,
    warmup: usize,
    iters: usize,
    budget_s: f64,
    store_secs: f64,
    /// Limit of one child run.
    timeout: Duration,
}

impl Plan {
    fn new(a: &Args) -> Plan {
        let full_sizes = vec![
            4,
            64,
            1 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
        ];
        if a.quick {
            Plan {
                quick: true,
                reps: a.reps.unwrap_or(2),
                ranks: a.ranks.clone().unwrap_or_else(|| vec![2]),
                sizes: a.sizes.clone().unwrap_or_else(|| vec![4, 4096, 65536]),
                warmup: 2,
                iters: 20,
                budget_s: 0.02,
                store_secs: 0.05,
                timeout: Duration::from_secs(60),
            }
        } else {
            Plan {
                quick: false,
                reps: a.reps.unwrap_or(3),
                ranks: a.ranks.clone().unwrap_or_else(|| vec![2, 4]),
                sizes: a.sizes.clone().unwrap_or(full_sizes),
                warmup: 5,
                iters: 500,
                budget_s: 1.0,
                store_secs: 1.0,
                timeout: Duration::from_secs(900),
            }
        }
    }
}

type Error = Box<dyn std::error::Error>;

/// What a child printed.
#[derive(Debug)]
struct Output {
    stdout: String,
    stderr: String,
}

/// Runs `cmd` to completion within `limit`; a child that runs longer is
/// killed with its process group.
fn run(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    use std::os::unix::process::CommandExt;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start {what}: {e}"))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let mut b = Vec::new();
                let _ = r.read_to_end(&mut b);
                s = String::from_utf8_lossy(&b).into_owned();
            }
            s
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => {
                // The whole group: the Python scripts start their own children.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{what} did not finish within {:.0} s and was killed",
                    limit.as_secs_f64()
                ));
            }
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!("{what} failed ({status}): {}", tail.join(" | ")));
    }
    Ok(Output { stdout, stderr })
}

/// The JSON objects among `text`'s lines (a `[rank R] ` prefix is skipped).
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.find('{').map(|i| &l[i..]))
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect()
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Where the helpers are.
#[derive(Debug)]
struct Env {
    bin_dir: PathBuf,
    compare_dir: PathBuf,
    /// `Some(version)` when `import torch` works and torch is not refused.
    torch: Result<String, String>,
    gpu: Result<String, String>,
}

impl Env {
    fn bin(&self, name: &str) -> Result<PathBuf, String> {
        let p = self.bin_dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "{name} not found in {} (build it: `{BUILD_HINT}`)",
                self.bin_dir.display()
            ))
        }
    }

    fn script(&self, name: &str) -> PathBuf {
        self.compare_dir.join(name)
    }
}

fn detect_torch(no_torch: bool) -> Result<String, String> {
    if no_torch {
        return Err("--no-torch given".into());
    }
    let mut cmd = Command::new("python3");
    cmd.args([
        "-W",
        "ignore",
        "-c",
        "import torch; print(torch.__version__)",
    ]);
    match run(&mut cmd, Duration::from_secs(120)) {
        Ok(o) => Ok(o.stdout.trim().to_string()),
        Err(_) => Err("torch not installed (`pip install torch`)".into()),
    }
}

fn detect_gpu() -> Result<String, String> {
    let mut cmd = Command::new("nvidia-smi");
    cmd.args(["--query-gpu=name,driver_version", "--format=csv,noheader"]);
    match run(&mut cmd, Duration::from_secs(60)) {
        Ok(o) if !o.stdout.trim().is_empty() => {
            Ok(o.stdout.lines().next().unwrap_or("").trim().into())
        }
        _ if Path::new("/proc/driver/nvidia/version").exists() => {
            Err("an NVIDIA driver is loaded but `nvidia-smi` lists no GPU".into())
        }
        _ => Err("no NVIDIA GPU (`nvidia-smi` not found or failing)".into()),
    }
}

// ---------------------------------------------------------------- store --

/// Store ops/s keyed by (op, config), one vector entry per run.
type Rates = BTreeMap<(String, String), Vec<f64>>;

#[derive(Debug, Default)]
struct StoreResult {
    ours: Rates,
    anchor: Rates,
    anchor_skipped: Option<String>,
    error: Option<String>,
}

fn parse_rates(text: &str, who: &str, into: &mut Rates) {
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && f[0] == who {
            if let Ok(v) = f[3].parse::<f64>() {
                into.entry((f[1].to_string(), f[2].to_string()))
                    .or_default()
                    .push(v);
            }
        }
    }
}

fn bench_store(env: &Env, plan: &Plan) -> StoreResult {
    let mut r = StoreResult::default();
    let ours = match env.bin("store_compare") {
        Ok(p) => p,
        Err(e) => {
            r.error = Some(e);
            return r;
        }
    };
    if let Err(e) = &env.torch {
        r.anchor_skipped = Some(e.clone());
    }
    let secs = format!("{}", plan.store_secs);
    for rep in 0..plan.reps {
        eprintln!("store: run {}/{}", rep + 1, plan.reps);
        match run(Command::new(&ours).arg(&secs), plan.timeout) {
            Ok(o) => parse_rates(&o.stdout, "chorus", &mut r.ours),
            Err(e) => {
                r.error = Some(e);
                return r;
            }
        }
        if r.anchor_skipped.is_none() {
            let mut cmd = Command::new("python3");
            cmd.arg(env.script("torch_store.py"))
                .args(["--seconds", &secs, "--clients", "1,16"]);
            match run(&mut cmd, plan.timeout) {
                Ok(o) => parse_rates(&o.stdout, "torch", &mut r.anchor),
                Err(e) => r.anchor_skipped = Some(format!("PyTorch side failed: {e}")),
            }
        }
    }
    r
}

fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else {
        format!("{:.1}k", v / 1e3)
    }
}

fn store_section(r: &StoreResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "### Store: chorus `TcpStore` beside PyTorch `TCPStore`\n"
    );
    if let Some(e) = &r.error {
        let _ = writeln!(md, "Not run: {e}\n");
        return;
    }
    let _ = writeln!(
        md,
        "Round trips of 64-byte values over loopback, server in the client's process (`store_compare` / \
         `torch_store.py`), ops/s, median of {reps} runs. The anchor of every row is PyTorch with the same \
         number of clients (its client is synchronous: one op in flight). Ratio = ours / PyTorch's. \
         Target: get and add ≥ 10× PyTorch's, set ≥ 1×.\n"
    );
    if let Some(s) = &r.anchor_skipped {
        let _ = writeln!(md, "PyTorch anchor skipped: {s}.\n");
    }
    let _ = writeln!(
        md,
        "| op | chorus clients × in flight | ours ops/s | PyTorch ops/s | ratio | target | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for op in ["set", "get", "add"] {
        for (cfg, label, anchor_cfg) in [
            ("1", "1 × 1", "1"),
            ("16", "16 × 1", "16"),
            ("1x32", "1 × 32", "1"),
            ("1x128", "1 × 128", "1"),
        ] {
            let ours = r
                .ours
                .get(&(op.to_string(), cfg.to_string()))
                .and_then(|v| median(v));
            let Some(ours) = ours else { continue };
            let anchor = r
                .anchor
                .get(&(op.to_string(), anchor_cfg.to_string()))
                .and_then(|v| median(v));
            let want = if op == "set" { 1.0 } else { 10.0 };
            let (a, ratio, met) = match anchor {
                Some(a) if a > 0.0 => {
                    let x = ours / a;
                    (fmt_rate(a), format!("{x:.2}×"), yes_no(x >= want))
                }
                _ => (
                    skipped_cell(r.anchor_skipped.as_deref()),
                    "—".into(),
                    "—".into(),
                ),
            };
            let _ = writeln!(
                md,
                "| {op} | {label} | {} | {a} | {ratio} | ≥ {want}× | {met} |",
                fmt_rate(ours)
            );
        }
    }
    md.push('\n');
}

fn yes_no(b: bool) -> String {
    if b {
        "yes".into()
    } else {
        "**no**".into()
    }
}

fn skipped_cell(reason: Option<&str>) -> String {
    match reason {
        Some(_) => "skipped".into(),
        None => "—".into(),
    }
}

// ------------------------------------------------------------------ tcp --

/// One all_reduce figure set: medians over runs.
#[derive(Debug, Clone, Copy)]
struct Point {
    bytes: usize,
    median_us: f64,
    p99_us: f64,
    busbw_gbps: f64,
}

#[derive(Debug, Default)]
struct TcpRanks {
    ranks: usize,
    ours: Vec<Point>,
    anchor: Vec<Point>,
    anchor_skipped: Option<String>,
    error: Option<String>,
}

/// Per-size runs of (median, p99, busbw), merged by median.
fn merge_points(runs: &BTreeMap<usize, Vec<[f64; 3]>>) -> Vec<Point> {
    runs.iter()
        .filter_map(|(&bytes, v)| {
            let col = |i: usize| median(&v.iter().map(|x| x[i]).collect::<Vec<_>>());
            Some(Point {
                bytes,
                median_us: col(0)?,
                p99_us: col(1)?,
                busbw_gbps: col(2).unwrap_or(f64::NAN),
            })
        })
        .collect()
}

/// Bus bandwidth in GB/s from the unrounded figures (the JSON's own
/// `busbw_gbps` has three decimals, 0 for small messages).
fn busbw(bytes: f64, ranks: Option<f64>, median_us: f64) -> Option<f64> {
    let n = ranks?;
    (n >= 1.0 && median_us > 0.0).then(|| bytes * 2.0 * (n - 1.0) / n / (median_us * 1e-6) / 1e9)
}

fn add_runs(rows: &[Value], into: &mut BTreeMap<usize, Vec<[f64; 3]>>) -> usize {
    let mut n = 0;
    for r in rows {
        let f = |k: &str| r.get(k).and_then(Value::as_f64);
        if let (Some(b), Some(m), Some(p)) = (f("bytes"), f("median_us"), f("p99_us")) {
            into.entry(b as usize).or_default().push([
                m,
                p,
                busbw(b, f("ranks"), m)
                    .or(f("busbw_gbps"))
                    .unwrap_or(f64::NAN),
            ]);
            n += 1;
        }
    }
    n
}

fn bench_tcp(env: &Env, plan: &Plan, ranks: usize) -> TcpRanks {
    let mut r = TcpRanks {
        ranks,
        ..Default::default()
    };
    let (launcher, bench) = match (env.bin("chorus-run"), env.bin("tcp_allreduce")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            r.error = Some(e);
            return r;
        }
    };
    if let Err(e) = &env.torch {
        r.anchor_skipped = Some(e.clone());
    }
    let sizes = plan
        .sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let budget = format!("{}", plan.budget_s);
    let (warmup, iters) = (plan.warmup.to_string(), plan.iters.to_string());
    let mut ours = BTreeMap::new();
    let mut anchor = BTreeMap::new();
    for rep in 0..plan.reps {
        eprintln!(
            "tcp all_reduce, {ranks} ranks: run {}/{}",
            rep + 1,
            plan.reps
        );
        let mut cmd = Command::new(&launcher);
        cmd.args(["--nproc-per-node", &ranks.to_string(), "--"])
            .arg(&bench)
            .args(["--sizes", &sizes, "--warmup", &warmup, "--iters", &iters])
            .args(["--budget-s", &budget]);
        match run(&mut cmd, plan.timeout) {
            Ok(o) => {
                if add_runs(&json_lines(&o.stdout), &mut ours) == 0 {
                    r.error = Some(format!(
                        "tcp_allreduce printed no results: {}",
                        o.stderr.trim()
                    ));
                    return r;
                }
            }
            Err(e) => {
                r.error = Some(e);
                return r;
            }
        }
        if r.anchor_skipped.is_none() {
            let mut cmd = Command::new("python3");
            cmd.args(["-W", "ignore"])
                .arg(env.script("gloo_allreduce.py"))
                .args(["--ranks", &ranks.to_string(), "--sizes", &sizes])
                .args([
                    "--warmup",
                    &warmup,
                    "--iters",
                    &iters,
                    "--budget-s",
                    &budget,
                ]);
            match run(&mut cmd, plan.timeout) {
                Ok(o) => {
                    add_runs(&json_lines(&o.stdout), &mut anchor);
                }
                Err(e) => r.anchor_skipped = Some(format!("Gloo side failed: {e}")),
            }
        }
    }
    r.ours = merge_points(&ours);
    r.anchor = if r.anchor_skipped.is_none() {
        merge_points(&anchor)
    } else {
        Vec::new()
    };
    r
}

fn fmt_bytes(b: usize) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn fmt_gbps(v: f64) -> String {
    if !v.is_finite() {
        "—".into()
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else if v >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.5}")
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

/// Small messages are judged on latency, large ones on bus bandwidth.
const SMALL_MAX: usize = 64 << 10;
const LARGE_MIN: usize = 16 << 20;

fn tcp_section(t: &TcpRanks, plan: &Plan, plots: Option<&str>, md: &mut String) {
    let n = t.ranks;
    let _ = writeln!(
        md,
        "### TCP backend beside Gloo: all_reduce f32, {n} ranks\n"
    );
    if let Some(e) = &t.error {
        let _ = writeln!(md, "Not run: {e}\n");
        return;
    }
    let _ = writeln!(
        md,
        "One process per rank on this machine, loopback (`chorus-run … tcp_allreduce` / `gloo_allreduce.py`). \
         Per run and size: {} warm-up ops, then up to {} timed ops (time budget {} s, at least 5), each \
         after a barrier, timed as the slowest rank's; the median and p99 of those, then the median of \
         {} runs. Bus bandwidth = bytes × 2(n−1)/n / median. Latency ratio = Gloo's / ours, bandwidth \
         ratio = ours / Gloo's (> 1: chorus is better). Targets: up to {} latency ≤ 1/5 of \
         Gloo's (ratio ≥ 5×); from {} bus bandwidth ≥ 2× Gloo's.\n",
        plan.warmup,
        plan.iters,
        plan.budget_s,
        plan.reps,
        fmt_bytes(SMALL_MAX),
        fmt_bytes(LARGE_MIN)
    );
    if let Some(s) = &t.anchor_skipped {
        let _ = writeln!(md, "Gloo anchor skipped: {s}.\n");
    }
    let _ = writeln!(
        md,
        "| size | ours median | ours p99 | Gloo median | Gloo p99 | latency ratio | ours busbw GB/s | Gloo busbw GB/s | busbw ratio | target | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    for o in &t.ours {
        let a = t.anchor.iter().find(|a| a.bytes == o.bytes);
        let (target, want_lat, want_bw) = if o.bytes <= SMALL_MAX {
            ("latency ≥ 5×", true, false)
        } else if o.bytes >= LARGE_MIN {
            ("busbw ≥ 2×", false, true)
        } else {
            ("—", false, false)
        };
        let (am, ap, lr, ab, br, met) = match a {
            Some(a) => {
                let lr = a.median_us / o.median_us;
                let br = o.busbw_gbps / a.busbw_gbps;
                let met = if want_lat {
                    yes_no(lr >= 5.0)
                } else if want_bw {
                    yes_no(br >= 2.0)
                } else {
                    "—".into()
                };
                (
                    fmt_us(a.median_us),
                    fmt_us(a.p99_us),
                    format!("{lr:.2}×"),
                    fmt_gbps(a.busbw_gbps),
                    format!("{br:.2}×"),
                    met,
                )
            }
            None => {
                let s = skipped_cell(t.anchor_skipped.as_deref().or(Some("")));
                (s.clone(), s.clone(), "—".into(), s, "—".into(), "—".into())
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {am} | {ap} | {lr} | {} | {ab} | {br} | {target} | {met} |",
            fmt_bytes(o.bytes),
            fmt_us(o.median_us),
            fmt_us(o.p99_us),
            fmt_gbps(o.busbw_gbps)
        );
    }
    md.push('\n');
    if let Some(p) = plots {
        let _ = writeln!(
            md,
            "![all_reduce latency, {n} ranks]({p}/tcp_allreduce_latency_{n}ranks.svg)\n\
             ![all_reduce bus bandwidth, {n} ranks]({p}/tcp_allreduce_busbw_{n}ranks.svg)\n"
        );
    }
}

// ---------------------------------------------------------------- plots --

struct Series {
    name: String,
    color: RGBColor,
    thin: bool,
    points: Vec<(f64, f64)>,
}

fn series(
    name: String,
    color: RGBColor,
    thin: bool,
    pts: impl Iterator<Item = (f64, f64)>,
) -> Series {
    Series {
        name,
        color,
        thin,
        points: pts
            .filter(|&(x, y)| x.is_finite() && y > 0.0 && y.is_finite())
            .collect(),
    }
}

/// The label of x = log2(bytes): the size when x is a whole number.
fn fmt_axis_bytes(v: f64) -> String {
    let k = v.round();
    if (v - k).abs() > 1e-6 || !(0.0..63.0).contains(&k) {
        return String::new();
    }
    fmt_bytes(1usize << k as u32)
}

/// A plot of `series` (x: log2 of the message size) with a log y axis.
fn plot(path: &Path, title: &str, y_label: &str, all: &[Series]) -> Result<(), Error> {
    let pts = all.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(format!("nothing to plot in {}", path.display()).into());
    }
    let (x0, x1) = (x0 - 0.5, x1 + 0.5);
    let (y0, y1) = (y0 / 1.5, y1 * 1.5);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(y_label)
        .x_labels(14)
        .x_label_formatter(&|v| fmt_axis_bytes(*v))
        .y_label_formatter(&|v| {
            if *v >= 100.0 {
                format!("{v:.0}")
            } else if *v >= 1.0 {
                format!("{v:.1}")
            } else if *v >= 0.001 {
                let s = format!("{v:.3}");
                s.trim_end_matches('0').to_string()
            } else {
                format!("{v:.0e}")
            }
        })
        .draw()?;
    for s in all {
        if s.points.is_empty() {
            continue;
        }
        let style = if s.thin {
            s.color.mix(0.5).stroke_width(1)
        } else {
            s.color.stroke_width(2)
        };
        let color = s.color;
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        if !s.thin {
            chart.draw_series(
                s.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, s.color.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

const OURS: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const ANCHOR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

fn tcp_plots(t: &TcpRanks, dir: &Path) -> Result<(), Error> {
    let n = t.ranks;
    let x = |p: &Point| (p.bytes as f64).log2();
    let lat = [
        series(
            "chorus median".into(),
            OURS,
            false,
            t.ours.iter().map(|p| (x(p), p.median_us)),
        ),
        series(
            "chorus p99".into(),
            OURS,
            true,
            t.ours.iter().map(|p| (x(p), p.p99_us)),
        ),
        series(
            "Gloo median".into(),
            ANCHOR,
            false,
            t.anchor.iter().map(|p| (x(p), p.median_us)),
        ),
        series(
            "Gloo p99".into(),
            ANCHOR,
            true,
            t.anchor.iter().map(|p| (x(p), p.p99_us)),
        ),
    ];
    plot(
        &dir.join(format!("tcp_allreduce_latency_{n}ranks.svg")),
        &format!("all_reduce f32 latency, {n} ranks (lower is better)"),
        "time per op (µs)",
        &lat,
    )?;
    let bw = [
        series(
            "chorus".into(),
            OURS,
            false,
            t.ours.iter().map(|p| (x(p), p.busbw_gbps)),
        ),
        series(
            "Gloo".into(),
            ANCHOR,
            false,
            t.anchor.iter().map(|p| (x(p), p.busbw_gbps)),
        ),
    ];
    plot(
        &dir.join(format!("tcp_allreduce_busbw_{n}ranks.svg")),
        &format!("all_reduce f32 bus bandwidth, {n} ranks (higher is better)"),
        "bus bandwidth (GB/s)",
        &bw,
    )
}

// ----------------------------------------------------------------- nccl --

#[derive(Debug, Default)]
struct NcclResult {
    skipped: Option<String>,
    ours: Vec<Value>,
    anchor: Vec<Value>,
    anchor_skipped: Option<String>,
    /// `group_bench --json` runs (chorus and raw NCCL) and their PyTorch
    /// anchor (`torch_coalesce.py --json`).
    groups: Vec<Value>,
    groups_anchor: Vec<Value>,
    groups_skipped: Option<String>,
}

fn bench_nccl(env: &Env, plan: &Plan, tmp: &Path) -> NcclResult {
    let mut r = NcclResult::default();
    if let Err(e) = &env.gpu {
        r.skipped = Some(e.clone());
        return r;
    }
    let bench = match env.bin("nccl_bench") {
        Ok(b) => b,
        Err(e) => {
            r.skipped = Some(e);
            return r;
        }
    };
    r.anchor_skipped = match &env.torch {
        Err(e) => Some(e.clone()),
        Ok(_) => {
            let mut cmd = Command::new("python3");
            cmd.args([
                "-W",
                "ignore",
                "-c",
                "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
            ]);
            run(&mut cmd, Duration::from_secs(120)).err().map(|_| {
                "torch has no CUDA here (`torch.cuda.is_available()` is false)".to_string()
            })
        }
    };
    let quick_args: &[&str] = if plan.quick {
        &["--iters", "2000", "--wake-iters", "50", "--seconds", "0.3"]
    } else {
        &[]
    };
    for rep in 0..plan.reps {
        eprintln!("nccl: run {}/{}", rep + 1, plan.reps);
        let json = tmp.join(format!("nccl_bench_{rep}.json"));
        let mut cmd = Command::new(&bench);
        cmd.args(quick_args).arg("--json").arg(&json);
        match run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
            Ok(v) => r.ours.push(v),
            Err(e) => {
                r.skipped = Some(format!("nccl_bench failed: {e}"));
                return r;
            }
        }
        bench_groups(env, plan, tmp, rep, &mut r);
        if r.anchor_skipped.is_none() {
            let json = tmp.join(format!("torch_nccl_{rep}.json"));
            let mut cmd = Command::new("python3");
            cmd.args(["-W", "ignore"]).arg(env.script("torch_nccl.py"));
            if plan.quick {
                cmd.args(["--iters", "2000", "--seconds", "0.3"]);
            }
            cmd.arg("--json").arg(&json);
            match run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
                Ok(v) => r.anchor.push(v),
                Err(e) => r.anchor_skipped = Some(format!("ProcessGroupNCCL side failed: {e}")),
            }
        }
    }
    r
}

/// One run of `group_bench` and, when PyTorch runs here, `torch_coalesce.py`.
fn bench_groups(env: &Env, plan: &Plan, tmp: &Path, rep: usize, r: &mut NcclResult) {
    if r.groups_skipped.is_some() {
        return;
    }
    let bench = match env.bin("group_bench") {
        Ok(b) => b,
        Err(e) => {
            r.groups_skipped = Some(e);
            return;
        }
    };
    let iters: &[&str] = if plan.quick { &["--iters", "50"] } else { &[] };
    let json = tmp.join(format!("group_bench_{rep}.json"));
    let mut cmd = Command::new(&bench);
    cmd.args(iters).arg("--json").arg(&json);
    match run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
        Ok(v) => r.groups.push(v),
        Err(e) => {
            r.groups_skipped = Some(format!("group_bench failed: {e}"));
            return;
        }
    }
    if r.anchor_skipped.is_none() {
        let json = tmp.join(format!("torch_coalesce_{rep}.json"));
        let mut cmd = Command::new("python3");
        cmd.args(["-W", "ignore"])
            .arg(env.script("torch_coalesce.py"))
            .args(iters)
            .arg("--json")
            .arg(&json);
        if let Ok(v) = run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
            r.groups_anchor.push(v);
        }
    }
}

/// Median over runs of `rows[width == w].<who>.<key>`.
fn group_med(runs: &[Value], w: u64, who: &str, key: &str) -> Option<f64> {
    med_at(runs, |v| {
        v.get("rows")?
            .as_array()?
            .iter()
            .find(|r| r.get("width").and_then(Value::as_u64) == Some(w))?
            .get(who)?
            .get(key)?
            .as_f64()
    })
}

/// chorus beside the raw NCCL/CUDA calls it is built from: what the
/// layers above NCCL cost per op.
fn raw_section(r: &NcclResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "### NCCL backend beside raw NCCL calls (one GPU, 1-rank group)\n"
    );
    if let Some(s) = r.skipped.as_ref().or(r.groups_skipped.as_ref()) {
        let _ = writeln!(md, "Skipped: {s}.\n");
        return;
    }
    let _ = writeln!(
        md,
        "Median of {reps} runs. Enqueue and round trip: one 1 MiB f32 all_reduce (`group_bench`, width 1: \
         chorus `all_reduce` + `.await` vs a bare `ncclAllReduce` + `cuStreamSynchronize`); stream-ordered \
         wait: `DeviceWork::stream_ordered()` vs a bare `cuEventRecord` + `cuStreamWaitEvent` \
         (`nccl_bench`). Ratio = chorus ÷ raw (the price of the layers above NCCL).\n"
    );
    let _ = writeln!(md, "| figure | chorus | raw NCCL / CUDA | ratio |");
    let _ = writeln!(md, "|---|---|---|---|");
    let num = |k: &'static str| move |v: &Value| v.get(k).and_then(Value::as_f64);
    let rows = [
        (
            "enqueue of one all_reduce (µs)",
            group_med(&r.groups, 1, "chorus_seq", "submit_us"),
            group_med(&r.groups, 1, "raw_seq", "submit_us"),
        ),
        (
            "round trip: issue until the GPU finished and the host knows (µs)",
            group_med(&r.groups, 1, "chorus_seq", "total_us"),
            group_med(&r.groups, 1, "raw_seq", "total_us"),
        ),
        (
            "stream-ordered wait (µs)",
            med_at(&r.ours, num("stream_ordered_median_us")),
            med_at(&r.ours, num("record_wait_us")),
        ),
    ];
    for (label, c, w) in rows {
        let f = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.2}"));
        let ratio = c
            .zip(w)
            .map_or("—".to_string(), |(c, w)| format!("{:.1}×", c / w));
        let _ = writeln!(md, "| {label} | {} | {} | {ratio} |", f(c), f(w));
    }
    let _ = writeln!(
        md,
        "| wake latency (end event complete → future woken) | see the table above | no waker (poll or block) | — |\n"
    );
}

fn groups_section(r: &NcclResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "### Sequential vs grouped all_reduce beside raw NCCL and PyTorch (one GPU, 1-rank group)\n"
    );
    if let Some(s) = r.skipped.as_ref().or(r.groups_skipped.as_ref()) {
        let _ = writeln!(md, "Skipped: {s}.\n");
        return;
    }
    let _ = writeln!(
        md,
        "`group_bench --json` (chorus: ops one by one, a group of ops, and `all_reduce_coalesced`; raw \
         `ncclAllReduce` in a loop and inside `ncclGroupStart/End`; \"raw + events\": the same raw calls \
         plus the input-ready record, stream wait and end record per op / per group (two events per launch), the floor \
         of any library that keeps that rule) and `torch_coalesce.py --json` (async `all_reduce`s; \
         `_coalescing_manager`), 1 MiB f32 each, median of {reps} runs of medians; total = submit until the \
         GPU finished, in µs. Target: chorus within 1.3× of raw NCCL, sequential and grouped \
         (judged on the total; grouped: the better of chorus's group and coalesced op).\n"
    );
    let _ = writeln!(
        md,
        "| width | chorus seq | chorus grouped | chorus coalesced | raw seq | raw grouped | raw + events seq / grouped | PyTorch seq | PyTorch coalesced | chorus ÷ raw (seq / grouped) | floor ÷ raw (seq / grouped) | met |"
    );
    let _ = writeln!(
        md,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let widths: Vec<u64> = r
        .groups
        .first()
        .and_then(|v| v.get("rows")?.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|row| row.get("width")?.as_u64())
        .collect();
    let cell = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.1}"));
    let times = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.1}×"));
    for w in widths {
        let t = |who| group_med(&r.groups, w, who, "total_us");
        let a = |who| group_med(&r.groups_anchor, w, who, "total_us");
        let (cs, cg, cc, rs, rg, es, eg) = (
            t("chorus_seq"),
            t("chorus_grouped"),
            t("chorus_coalesced"),
            t("raw_seq"),
            t("raw_grouped"),
            t("raw_events_seq"),
            t("raw_events_grouped"),
        );
        let best_grouped = match (cg, cc) {
            (Some(g), Some(c)) => Some(g.min(c)),
            (g, c) => g.or(c),
        };
        let ratio = |c: Option<f64>, r: Option<f64>| c.zip(r).map(|(c, r)| c / r);
        let (qs, qg) = (ratio(cs, rs), ratio(best_grouped, rg));
        let met = match (qs, qg) {
            (Some(a), Some(b)) => yes_no(a <= 1.3 && b <= 1.3),
            _ => "—".into(),
        };
        let _ = writeln!(
            md,
            "| {w} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} / {} | {} / {} | {met} |",
            cell(cs),
            cell(cg),
            cell(cc),
            cell(rs),
            cell(rg),
            cell(es),
            cell(eg),
            cell(a("torch_seq")),
            cell(a("torch_coalesced")),
            times(qs),
            times(qg),
            times(ratio(es, rs)),
            times(ratio(eg, rg)),
        );
    }
    md.push('\n');
}

fn read_json(p: &Path) -> Result<Value, String> {
    let s = std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    serde_json::from_str(&s).map_err(|e| format!("bad JSON in {}: {e}", p.display()))
}

/// Median over runs of the number at `path` (keys, or `wake[i].key`).
fn med_at(runs: &[Value], f: impl Fn(&Value) -> Option<f64>) -> Option<f64> {
    median(&runs.iter().filter_map(f).collect::<Vec<_>>())
}

fn nccl_section(r: &NcclResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "### NCCL backend beside PyTorch ProcessGroupNCCL (one GPU, 1-rank group)\n"
    );
    if let Some(s) = &r.skipped {
        let _ = writeln!(md, "Skipped: {s}.\n");
        return;
    }
    let _ = writeln!(
        md,
        "Host-side costs of a small all_reduce (`nccl_bench --json` / `torch_nccl.py --json`), median of \
         {reps} runs. Ratio = PyTorch's time / ours (for round trips: ours / PyTorch's), > 1: chorus is \
         better. Targets.\n"
    );
    if let Some(s) = &r.anchor_skipped {
        let _ = writeln!(md, "PyTorch anchor skipped: {s}.\n");
    }
    let _ = writeln!(md, "| figure | ours | PyTorch | ratio | target | met |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let num = |k: &'static str| move |v: &Value| v.get(k).and_then(Value::as_f64);
    let rows: [(&str, &str, &str, f64, bool); 6] = [
        (
            "enqueue (all_reduce call), median",
            "enqueue_median_us",
            "enqueue_median_us",
            1.5,
            true,
        ),
        (
            "enqueue, p99",
            "enqueue_p99_us",
            "enqueue_p99_us",
            f64::NAN,
            true,
        ),
        (
            "stream-ordered wait, median (PyTorch: `work.wait()`)",
            "stream_ordered_median_us",
            "wait_median_us",
            1.0,
            true,
        ),
        (
            "stream-ordered wait, p99",
            "stream_ordered_p99_us",
            "wait_p99_us",
            f64::NAN,
            true,
        ),
        (
            "awaited round trips per second",
            "round_trips_per_s",
            "round_trips_per_s",
            3.0,
            false,
        ),
        (
            "round trips per second, blocking `wait_timeout` (PyTorch: as above)",
            "round_trips_wait_timeout_per_s",
            "round_trips_per_s",
            3.0,
            false,
        ),
    ];
    for (label, ok, ak, target, is_time) in rows {
        let Some(o) = med_at(&r.ours, num(ok)) else {
            continue;
        };
        let a = med_at(&r.anchor, num(ak));
        let ratio = a.map(|a| if is_time { a / o } else { o / a });
        let (tgt, met) = if target.is_nan() {
            ("—".to_string(), "—".to_string())
        } else if is_time {
            (format!("≤ {target} µs"), yes_no(o <= target))
        } else {
            (
                format!("≥ {target}× PyTorch's"),
                ratio.map_or("—".into(), |x| yes_no(x >= target)),
            )
        };
        let f = |v: f64| {
            if is_time {
                format!("{v:.2} µs")
            } else {
                format!("{v:.0}/s")
            }
        };
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {tgt} | {met} |",
            f(o),
            a.map_or(skipped_cell(r.anchor_skipped.as_deref().or(Some(""))), f),
            ratio.map_or("—".into(), |x| format!("{x:.2}×"))
        );
    }
    // Wake latency: PyTorch has no waker (its host callback arrives ~107 µs
    // after the event), so these are judged on the absolute targets.
    let wake_rows = r
        .ours
        .first()
        .and_then(|v| v.get("wake"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    for i in 0..wake_rows {
        let w = |k: &'static str| move |v: &Value| v.get("wake")?.get(i)?.get(k)?.as_f64();
        let (Some(spin), Some(pause)) = (
            med_at(&r.ours, w("spin_us")),
            med_at(&r.ours, w("observer_pause")),
        ) else {
            continue;
        };
        for (what, k, target) in [
            ("median", "wake_median_us", 5.0),
            ("p99", "wake_p99_us", 50.0),
        ] {
            if let Some(o) = med_at(&r.ours, w(k)) {
                let _ = writeln!(
                    md,
                    "| wake latency after a {spin:.0} µs kernel (observer pause {pause:.0}), {what} | {o:.2} µs | n/a (no waker) | — | ≤ {target} µs | {} |",
                    yes_no(o <= target)
                );
            }
        }
    }
    md.push('\n');
}

// --------------------------------------------------------------- report --

fn machine(env: &Env) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |s| s.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or("?".to_string(), |kb| {
            format!("{:.0} GiB", kb / 1024.0 / 1024.0)
        });
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                l.trim_start_matches("PRETTY_NAME=")
                    .trim_matches('"')
                    .to_string()
            })
        })
        .unwrap_or_else(|| "unknown OS".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    // Field 19 of /proc/self/stat, counted after the command name's ')'.
    let nice = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(16).map(str::to_string))
        })
        .unwrap_or_else(|| "?".into());
    let mut s = format!(
        "- CPU: {cpu}, {cores} cores available, {mem} memory\n- OS: {os}, Linux {}\n- load average at start: {}; niceness of the run: {nice}\n",
        kernel.trim(),
        load.join(" ")
    );
    let _ = writeln!(
        s,
        "- GPU: {}",
        match &env.gpu {
            Ok(g) => g.clone(),
            Err(e) => format!("none ({e})"),
        }
    );
    let _ = writeln!(
        s,
        "- PyTorch: {}",
        match &env.torch {
            Ok(v) => v.clone(),
            Err(e) => format!("none ({e})"),
        }
    );
    s
}

fn shell_quote(a: &str) -> String {
    if !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+".contains(c))
    {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// "YYYY-MM-DD HH:MM UTC" of now.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// `old` with the text between the markers replaced by `section` (the
/// markers kept), or `section` appended between new markers.
fn splice(old: &str, section: &str) -> String {
    let block = format!("{BEGIN}\n{}\n{END}", section.trim_end());
    match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{block}{}", &old[..b], &old[e + END.len()..])
        }
        _ if old.trim().is_empty() => format!("# Benchmark results\n\n{block}\n"),
        _ => format!("{}\n\n{block}\n", old.trim_end()),
    }
}

/// `target` relative to `base` when it lies under it.
fn relative(target: &Path, base: &Path) -> String {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (t, b) = (abs(target), abs(base));
    t.strip_prefix(&b)
        .map(|r| r.display().to_string())
        .unwrap_or_else(|_| t.display().to_string())
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let plan = Plan::new(&args);
    let started = Instant::now();
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .ok_or("the executable has no folder")?
            .to_path_buf(),
    };
    let compare_dir = args.compare_dir.clone().unwrap_or_else(|| {
        let baked = Path::new(env!("CARGO_MANIFEST_DIR")).join("compare");
        if baked.is_dir() {
            baked
        } else {
            PathBuf::from("benches/compare")
        }
    });
    let env = Env {
        bin_dir,
        compare_dir,
        torch: detect_torch(args.no_torch),
        gpu: detect_gpu(),
    };
    if let Err(e) = env.bin("chorus-run") {
        return Err(e.into());
    }
    std::fs::create_dir_all(&args.plots)
        .map_err(|e| format!("cannot create {}: {e}", args.plots.display()))?;
    let tmp = std::env::temp_dir().join(format!("chorus-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;

    let store = bench_store(&env, &plan);
    let tcp: Vec<TcpRanks> = plan
        .ranks
        .iter()
        .map(|&n| bench_tcp(&env, &plan, n))
        .collect();
    let nccl = bench_nccl(&env, &plan, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);

    let out_dir = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let plots_rel = relative(&args.plots, out_dir);
    let mut plot_errors = Vec::new();
    let mut tcp_plot_ok = Vec::new();
    for t in &tcp {
        let ok = t.error.is_none() && !t.ours.is_empty();
        let ok = ok
            && match tcp_plots(t, &args.plots) {
                Ok(()) => true,
                Err(e) => {
                    plot_errors.push(format!("{} ranks: {e}", t.ranks));
                    false
                }
            };
        tcp_plot_ok.push(ok);
    }

    let mut md = String::new();
    let _ = writeln!(
        md,
        "## chorus-bench ({})\n",
        if plan.quick { "quick run" } else { "full run" }
    );
    let _ = writeln!(
        md,
        "Written by `chorus-bench`; everything between the chorus-bench markers is replaced on the next run.\n"
    );
    let cmd: Vec<String> = std::env::args().map(|a| shell_quote(&a)).collect();
    let _ = writeln!(
        md,
        "Command (after `{BUILD_HINT}`; `bash benches/run.sh` does both):\n\n    {}\n",
        cmd.join(" ")
    );
    let _ = writeln!(
        md,
        "Run {}, {:.0} s.\n\nMachine:\n\n{}",
        utc_now(),
        started.elapsed().as_secs_f64(),
        machine(&env)
    );

    let mut skipped = Vec::new();
    if let Some(e) = &store.error {
        skipped.push(format!("store comparison: {e}"));
    } else if let Some(e) = &store.anchor_skipped {
        skipped.push(format!("store, PyTorch TCPStore anchor: {e}"));
    }
    for t in &tcp {
        if let Some(e) = &t.error {
            skipped.push(format!("TCP all_reduce, {} ranks: {e}", t.ranks));
        } else if let Some(e) = &t.anchor_skipped {
            skipped.push(format!(
                "TCP all_reduce, {} ranks, Gloo anchor: {e}",
                t.ranks
            ));
        }
    }
    if plan.quick && args.ranks.is_none() && args.sizes.is_none() {
        skipped.push(
            "4 ranks and sizes above 64 KiB: quick run (run without `--quick` for the full sweep)"
                .into(),
        );
    }
    if let Some(e) = &nccl.skipped {
        skipped.push(format!("NCCL backend comparisons: {e}"));
    } else if let Some(e) = &nccl.anchor_skipped {
        skipped.push(format!("NCCL, ProcessGroupNCCL anchor: {e}"));
    }
    if nccl.skipped.is_none() {
        if let Some(e) = &nccl.groups_skipped {
            skipped.push(format!("grouped vs sequential beside raw NCCL: {e}"));
        }
    }
    for e in &plot_errors {
        skipped.push(format!("plot, {e}"));
    }
    let _ = writeln!(md, "\nSkipped:\n");
    for s in &skipped {
        let _ = writeln!(md, "- {s}");
    }
    md.push('\n');

    store_section(&store, plan.reps, &mut md);
    for (t, ok) in tcp.iter().zip(&tcp_plot_ok) {
        tcp_section(t, &plan, ok.then_some(plots_rel.as_str()), &mut md);
    }
    nccl_section(&nccl, plan.reps, &mut md);
    raw_section(&nccl, plan.reps, &mut md);
    groups_section(&nccl, plan.reps, &mut md);

    let old = std::fs::read_to_string(&args.out).unwrap_or_default();
    if let Some(dir) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, splice(&old, &md))
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    eprintln!(
        "wrote {} and plots in {} ({:.1} s)",
        args.out.display(),
        args.plots.display(),
        started.elapsed().as_secs_f64()
    );
    for s in &skipped {
        eprintln!("skipped: {s}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_between_markers_and_keeps_the_rest() {
        let old = format!("# R\n\nhand written\n\n{BEGIN}\nold run\n{END}\n\n## After\nkept\n");
        let new = splice(&old, "new run\n");
        assert!(new.contains("hand written") && new.contains("## After\nkept"));
        assert!(new.contains("new run") && !new.contains("old run"));
        assert_eq!(new.matches(BEGIN).count(), 1);
        // Idempotent shape on a second run.
        let again = splice(&new, "third");
        assert_eq!(again.matches(END).count(), 1);
        assert!(again.contains("third") && !again.contains("new run"));
    }

    #[test]
    fn splice_appends_without_markers() {
        let new = splice("# R\n\n## Store\ntable\n", "run");
        assert!(new.starts_with("# R\n\n## Store\ntable\n\n"));
        assert!(new.trim_end().ends_with(END));
        assert!(splice("", "run").starts_with("# Benchmark results"));
    }

    #[test]
    fn median_of_odd_even_and_nan() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn parses_prefixed_json_and_rate_lines() {
        let rows = json_lines(
            "[rank 0] {\"bytes\":4,\"median_us\":10.5,\"p99_us\":20,\"busbw_gbps\":0.001}\nnoise\n",
        );
        let mut m = BTreeMap::new();
        assert_eq!(add_runs(&rows, &mut m), 1);
        assert_eq!(m[&4][0], [10.5, 20.0, 0.001]);
        let rows = json_lines(
            "{\"ranks\":2,\"bytes\":1000,\"median_us\":1,\"p99_us\":2,\"busbw_gbps\":0}",
        );
        add_runs(&rows, &mut m);
        assert!(
            (m[&1000][0][2] - 1.0).abs() < 1e-9,
            "busbw from unrounded figures"
        );
        let mut r = Rates::new();
        parse_rates(
            "# header\nchorus set     1   12345\ntorch get 16 99\nchorus add 1x32 7\n",
            "chorus",
            &mut r,
        );
        assert_eq!(r.len(), 2);
        assert_eq!(r[&("set".into(), "1".into())], vec![12345.0]);
    }

    #[test]
    fn utc_date_is_well_formed() {
        let s = utc_now();
        assert_eq!(s.len(), "2026-11-29 17:13 UTC".len());
        assert!(s.starts_with("20"));
    }
}
