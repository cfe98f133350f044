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
//!
//! Files: `cli` (the command line and the run's plan), `child` (running one
//! program within a time limit), `env` (where the programs and scripts are,
//! what this machine has), `run` (running each comparison), `parse`
//! (reading the programs' output), `format` (figures as printed),
//! `markdown` (the report's sections, header and place in its file),
//! `plots` (the SVG plots).
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
use cli::{Args, Plan};
use env::{detect_gpu, detect_torch, Env, BUILD_HINT};
use markdown::{
    groups_section, machine, nccl_section, raw_section, relative, shell_quote, splice,
    store_section, tcp_section, utc_now,
};
use plots::tcp_plots;
use run::{bench_nccl, bench_store, bench_tcp, TcpRanks};

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
