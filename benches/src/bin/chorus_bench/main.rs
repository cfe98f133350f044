//! chorus-bench: every comparison this machine allows, in one run, each
//! written to its section of benches/RESULTS.md, with SVG plots.
//!
//! ```sh
//! cargo build --release -p chorus-benches -p chorus-launcher
//! target/release/chorus-bench [--quick] [--suites store,tcp,checked,nccl] [--out benches/RESULTS.md] [--plots benches/plots]
//! ```
//!
//! (`bash benches/run.sh [ARGS]` does both.) It builds nothing: it runs the
//! sibling executables of its own target directory (`chorus-run`,
//! `tcp_allreduce`, `store_compare`, `pingpong`, `nccl_bench`,
//! `group_bench`) and the PyTorch scripts of `benches/compare/`:
//!
//! * `store`: chorus's `TcpStore` beside PyTorch's `TCPStore`
//!   (`store_compare` and `torch_store.py`), with a ping-pong floor;
//! * `tcp`: the TCP backend beside Gloo, f32 all_reduce with 2 and 4
//!   ranks, 4 B to 64 MiB (`tcp_allreduce` under `chorus-run`, and
//!   `gloo_allreduce.py`), with a ping-pong floor;
//! * `checked`: the checked mode's cost per op on the TCP backend
//!   (`tcp_allreduce` with and without `CHORUS_CHECK_OPS=1`);
//! * `nccl`, on a machine with an NVIDIA GPU: the NCCL backend beside
//!   PyTorch's ProcessGroupNCCL (`nccl_bench` and `torch_nccl.py`), beside
//!   raw NCCL calls, and sequential vs grouped all_reduces beside PyTorch's
//!   coalescing manager (`group_bench` and `torch_coalesce.py`).
//!
//! A comparison whose anchor cannot run (torch not installed) is reported
//! with ours only and the reason. Each figure is the median over `--reps`
//! runs, each run itself a median over many iterations after a warm-up;
//! the two sides of a ratio run alternately within the same invocation.
//! Each section goes between its markers (`<!-- chorus-bench:KEY:begin -->`
//! and `<!-- chorus-bench:KEY:end -->`, appended when missing) and opens
//! with the date, the commit, the machine and the command. A suite that
//! did not run here (no GPU, a program failed) leaves its section as it
//! was, so hand-written sections and other machines' figures stay.
//!
//! Files: `cli` (the command line and the run's plan), `child` (running one
//! program within a time limit), `env` (where the programs and scripts are,
//! what this machine has), `run` (running each comparison), `parse`
//! (reading the programs' output), `format` (figures as printed),
//! `markdown` (the report's sections, where they come from, and their
//! places in the file), `plots` (the SVG plots).
#![forbid(unsafe_code)]

mod child;
mod cli;
mod env;
mod format;
mod markdown;
mod parse;
mod plots;
mod run;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;

use child::Error;
use cli::{Args, Plan, Suite};
use env::{detect_gpu, detect_torch, Env};
use markdown::{
    checked_section, commit_here, groups_section, machine, nccl_section, raw_section, relative,
    shell_quote, splice, store_section, tcp_section, utc_now, Provenance,
};
use plots::tcp_plots;
use run::{bench_checked, bench_nccl, bench_store, bench_tcp};

/// A report section: its marker key and its Markdown, heading included.
struct Section {
    key: &'static str,
    text: String,
}

/// `title`, where the figures come from, then `body`.
fn section(
    key: &'static str,
    title: &str,
    prov: &Provenance,
    body: impl FnOnce(&mut String),
) -> Section {
    let mut text = format!("{title}\n\n");
    prov.write(&mut text);
    body(&mut text);
    Section { key, text }
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
    let prov = Provenance {
        date: utc_now(),
        commit: args
            .commit
            .clone()
            .unwrap_or_else(|| commit_here(&args.out, &args.plots)),
        machine: machine(&env),
        command: std::env::args()
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" "),
    };
    let out_dir = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let plots_rel = relative(&args.plots, out_dir);
    let mut sections = Vec::new();
    // (suite, why its sections were not written)
    let mut not_written: Vec<(String, String)> = Vec::new();
    let mut failed = false;

    if plan.suites.contains(&Suite::Store) {
        let r = bench_store(&env, &plan);
        match &r.error {
            Some(e) => {
                failed = true;
                not_written.push(("store".into(), e.clone()));
            }
            None => sections.push(section(
                "store",
                "## Store: chorus `TcpStore` beside PyTorch `TCPStore`",
                &prov,
                |md| store_section(&r, plan.reps, md),
            )),
        }
    }
    if plan.suites.contains(&Suite::Tcp) {
        let tcp: Vec<_> = plan
            .ranks
            .iter()
            .map(|&n| bench_tcp(&env, &plan, n))
            .collect();
        if let Some(t) = tcp.iter().find(|t| t.error.is_some()) {
            failed = true;
            let e = t.error.clone().unwrap_or_default();
            not_written.push(("tcp".into(), format!("{} ranks: {e}", t.ranks)));
        } else {
            let mut plotted = Vec::new();
            for t in &tcp {
                match tcp_plots(t, &args.plots) {
                    Ok(()) => plotted.push((t.ranks, plots_rel.as_str())),
                    Err(e) => eprintln!("chorus-bench: no plot of {} ranks: {e}", t.ranks),
                }
            }
            let all: Vec<_> = tcp.iter().collect();
            sections.push(section(
                "tcp",
                "## TCP backend beside Gloo: all_reduce f32",
                &prov,
                |md| tcp_section(&all, &plan, &plotted, md),
            ));
        }
    }
    if plan.suites.contains(&Suite::Checked) {
        let r = bench_checked(&env, &plan);
        match &r.error {
            Some(e) => {
                failed = true;
                not_written.push(("checked".into(), e.clone()));
            }
            None => sections.push(section("checked", "### On the TCP backend", &prov, |md| {
                checked_section(&r, &plan, md)
            })),
        }
    }
    if plan.suites.contains(&Suite::Nccl) {
        if let Err(e) = &env.gpu {
            not_written.push(("nccl".into(), e.clone()));
        } else {
            let r = bench_nccl(&env, &plan, &tmp);
            if let Some(e) = &r.skipped {
                failed = true;
                not_written.push(("nccl".into(), e.clone()));
            } else {
                sections.push(section(
                    "nccl",
                    "## NCCL backend beside PyTorch ProcessGroupNCCL (one GPU, 1-rank group)",
                    &prov,
                    |md| nccl_section(&r, plan.reps, md),
                ));
                if let Some(e) = &r.groups_skipped {
                    failed = true;
                    not_written.push(("nccl-raw, groups".into(), e.clone()));
                } else {
                    sections.push(section(
                        "nccl-raw",
                        "## NCCL backend beside raw NCCL calls (one GPU, 1-rank group)",
                        &prov,
                        |md| raw_section(&r, plan.reps, md),
                    ));
                    sections.push(section(
                        "groups",
                        "## Sequential vs grouped all_reduce beside raw NCCL and PyTorch (one GPU, 1-rank group)",
                        &prov,
                        |md| groups_section(&r, plan.reps, md),
                    ));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);

    let mut text = std::fs::read_to_string(&args.out).unwrap_or_default();
    for s in &sections {
        text = splice(&text, s.key, &s.text);
    }
    if let Some(dir) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, text)
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    let mut summary = String::new();
    let keys: Vec<&str> = sections.iter().map(|s| s.key).collect();
    let _ = write!(
        summary,
        "wrote the sections {} of {} and plots in {} ({:.1} s)",
        keys.join(", "),
        args.out.display(),
        args.plots.display(),
        started.elapsed().as_secs_f64()
    );
    eprintln!("{summary}");
    for (suite, why) in &not_written {
        eprintln!("not written: {suite}: {why}");
    }
    if failed {
        return Err("a suite failed (see above); its section was left as it was".into());
    }
    Ok(())
}
