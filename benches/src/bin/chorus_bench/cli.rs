//! The command line ([`Args`]) and what it makes of the run ([`Plan`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "chorus-bench",
    about = "Runs every benchmark comparison this machine allows and writes RESULTS.md and SVG plots"
)]
pub(crate) struct Args {
    /// Seconds instead of minutes: small sizes, 2 ranks, short budgets (the CI smoke run).
    #[arg(long)]
    pub(crate) quick: bool,
    /// The suites to run (default: every one; those this machine cannot
    /// run, such as `nccl` without a GPU, are skipped and their sections
    /// left as they are).
    #[arg(long, value_delimiter = ',', default_value = "store,tcp,checked,nccl")]
    pub(crate) suites: Vec<Suite>,
    /// The report file; each suite's section, between its markers, is replaced.
    #[arg(long, default_value = "benches/RESULTS.md")]
    pub(crate) out: PathBuf,
    /// The commit the executables were built from, as the report names it
    /// (default: `git rev-parse --short HEAD` here, marked `+changes` when
    /// tracked files other than the report differ from it).
    #[arg(long)]
    pub(crate) commit: Option<String>,
    /// Folder for the SVG plots.
    #[arg(long, default_value = "benches/plots")]
    pub(crate) plots: PathBuf,
    /// Leave out the PyTorch anchors even when torch is installed.
    #[arg(long)]
    pub(crate) no_torch: bool,
    /// Runs of each measurement; figures are their median (default 3, quick 2).
    #[arg(long)]
    pub(crate) reps: Option<usize>,
    /// Rank counts of the TCP comparison (default 2,4; quick 2).
    #[arg(long, value_delimiter = ',')]
    pub(crate) ranks: Option<Vec<usize>>,
    /// Message sizes in bytes of the TCP comparison (default 4 B to 64 MiB).
    #[arg(long, value_delimiter = ',')]
    pub(crate) sizes: Option<Vec<usize>>,
    /// Folder holding chorus-run, tcp_allreduce, store_compare, nccl_bench (default: this executable's).
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
    /// Folder holding the PyTorch scripts (default: benches/compare of this checkout).
    #[arg(long)]
    pub(crate) compare_dir: Option<PathBuf>,
}

/// A comparison and the report sections it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Suite {
    /// chorus's store beside PyTorch's TCPStore.
    Store,
    /// The TCP backend beside Gloo (2 and 4 ranks).
    Tcp,
    /// The checked mode's cost per op on the TCP backend.
    Checked,
    /// The NCCL backend beside ProcessGroupNCCL, raw NCCL and PyTorch's
    /// coalescing manager (needs a GPU).
    Nccl,
}

/// Knobs that differ between the full and the quick run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) suites: Vec<Suite>,
    pub(crate) reps: usize,
    pub(crate) ranks: Vec<usize>,
    pub(crate) sizes: Vec<usize>,
    pub(crate) warmup: usize,
    pub(crate) iters: usize,
    pub(crate) budget_s: f64,
    pub(crate) store_secs: f64,
    /// Seconds of each ping-pong floor figure.
    pub(crate) floor_secs: f64,
    /// Sizes of the checked suite, and `tcp_allreduce`'s knobs there.
    pub(crate) checked_sizes: Vec<usize>,
    pub(crate) checked_args: Vec<String>,
    /// Limit of one child run.
    pub(crate) timeout: Duration,
}

impl Plan {
    pub(crate) fn new(a: &Args) -> Plan {
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
                suites: a.suites.clone(),
                reps: a.reps.unwrap_or(2),
                ranks: a.ranks.clone().unwrap_or_else(|| vec![2]),
                sizes: a.sizes.clone().unwrap_or_else(|| vec![4, 4096, 65536]),
                warmup: 2,
                iters: 20,
                budget_s: 0.02,
                store_secs: 0.05,
                floor_secs: 0.02,
                checked_sizes: vec![4, 4096],
                checked_args: ["--warmup", "2", "--iters", "20", "--budget-s", "0.02"]
                    .map(String::from)
                    .to_vec(),
                timeout: Duration::from_secs(60),
            }
        } else {
            Plan {
                quick: false,
                suites: a.suites.clone(),
                reps: a.reps.unwrap_or(3),
                ranks: a.ranks.clone().unwrap_or_else(|| vec![2, 4]),
                sizes: a.sizes.clone().unwrap_or(full_sizes),
                warmup: 5,
                iters: 500,
                budget_s: 1.0,
                store_secs: 1.0,
                floor_secs: 0.3,
                // tcp_allreduce's own defaults (200 timed ops, 3 s a size).
                checked_sizes: vec![4, 65536, 16 << 20],
                checked_args: Vec::new(),
                timeout: Duration::from_secs(900),
            }
        }
    }
}
