//! The TCP backend's latency, bus bandwidth and CPU time per op: f32
//! `all_reduce` (sum) or `broadcast` (from rank 0), one rank per process
//! (start it with `chorus-run`). Rank 0 prints one JSON line per size:
//!
//! ```text
//! {"impl":"chorus","op":..,"checked":..,"algorithm":..,"transport":..,"chunk_bytes":..,
//!  "ranks":N,"bytes":B,"iters":..,"median_us":..,"p99_us":..,"busbw_gbps":..,"cpu_us":..}
//! ```
//!
//! `cpu_us` is the CPU time (user and system) of all ranks together per
//! timed iteration, the barrier before each op included.
//! `CHORUS_CHECK_OPS=1` on every rank measures the checked mode,
//! `CHORUS_SHM=0` the socket path without shared memory.
//!
//! ```sh
//! target/release/chorus-run --nproc-per-node 2 -- target/release/tcp_allreduce --sizes 4,65536,16777216
//! # the crossover between the two algorithms, and the chunk size:
//! for a in direct ring; do
//!   target/release/chorus-run --nproc-per-node 4 -- target/release/tcp_allreduce \
//!     --algorithm $a --sizes 65536,262144,1048576,4194304
//! done
//! target/release/chorus-run --nproc-per-node 4 -- target/release/tcp_allreduce --chunk-bytes 131072 --sizes 16777216
//! ```
//!
//! With `--reform` it measures a re-form instead, without `chorus-run`:
//! ranks as tasks of this one process (`reform`). With `--init-only` it
//! measures how long the group takes to form and to run its first 4-byte
//! all_reduce (`init`):
//!
//! ```sh
//! target/release/chorus-run --nproc-per-node 256 -- target/release/tcp_allreduce --init-only
//! ```
//!
//! Files: `measure` (the timed loop of each size), `reform` (the time from
//! a lost rank to the first op on the re-formed group), `init` (forming
//! the group and its first op).
#![forbid(unsafe_code)]

mod init;
mod measure;
mod reform;

use chorus::{ProcessGroup, TcpOptions};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "TCP backend all_reduce / broadcast latency, bus bandwidth and CPU per op")]
pub(crate) struct Args {
    /// Message sizes in bytes (f32 elements = bytes / 4).
    #[arg(long, value_delimiter = ',', default_value = "4,65536,16777216")]
    pub(crate) sizes: Vec<usize>,
    /// Warm-up iterations per size.
    #[arg(long, default_value_t = 5)]
    pub(crate) warmup: usize,
    /// Timed iterations per size (fewer are run for large sizes, at least 5).
    #[arg(long, default_value_t = 200)]
    pub(crate) iters: usize,
    /// Time budget per size in seconds.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) budget_s: f64,
    /// Milliseconds the last rank sleeps before each timed op, so that the
    /// others wait for it (the line's `rank0_cpu_pct` is what rank 0's
    /// waiting costs: its spin, then asleep).
    #[arg(long, default_value_t = 0)]
    pub(crate) late_ms: u64,
    /// `barrier`: every timed op after a barrier, the op's time the slowest
    /// rank's (the latency of one op that all ranks start together);
    /// `loop`: as osu_allreduce and MPI benchmarks time it, `--rounds`
    /// rounds of back-to-back ops after one barrier, a round's figure the
    /// slowest rank's mean time per op, the median of the rounds reported.
    #[arg(long, default_value = "barrier")]
    pub(crate) timing: measure::Timing,
    /// `--timing loop`: rounds per size.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// The op: `all_reduce` (sum) or `broadcast` (from rank 0).
    #[arg(long, default_value = "all_reduce")]
    pub(crate) op: measure::Bench,
    /// `auto`: the logarithmic algorithms (recursive doubling; a binomial
    /// tree for broadcast) below `TcpOptions::crossover_bytes`, the
    /// bandwidth-optimal ones (ring; a pipelined chain for broadcast) from
    /// there on; `small` (also `direct`) or `ring`: one of them at every
    /// size.
    #[arg(long, default_value = "auto")]
    pub(crate) algorithm: Algorithm,
    /// Largest payload of one frame (`TcpOptions::chunk_bytes`; default the
    /// backend's).
    #[arg(long)]
    pub(crate) chunk_bytes: Option<usize>,
    /// Peers on this host over `unix` sockets (the default) or loopback `tcp`.
    #[arg(long, default_value = "unix")]
    pub(crate) transport: Transport,
    /// Measure a re-form instead (no `chorus-run`): the time from a lost
    /// rank to the first op on the re-formed group, ranks as tasks of this
    /// process over loopback with one in-memory store.
    #[arg(long)]
    pub(crate) reform: bool,
    /// `--reform`: ranks before the loss.
    #[arg(long, default_value_t = 4, requires = "reform")]
    pub(crate) ranks: usize,
    /// `--reform`: the quorum's window, in milliseconds.
    #[arg(long, default_value_t = 200, requires = "reform")]
    pub(crate) window_ms: u64,
    /// `--reform`: trials.
    #[arg(long, default_value_t = 10, requires = "reform")]
    pub(crate) trials: usize,
    /// `--reform`: lose nobody; every rank re-forms.
    #[arg(long, requires = "reform")]
    pub(crate) all_alive: bool,
    /// Measure forming the group and its first 4-byte all_reduce instead
    /// (under `chorus-run`).
    #[arg(long, conflicts_with = "reform")]
    pub(crate) init_only: bool,
    /// `--init-only`: start the first all_reduce right after init on each
    /// rank, without the store barrier that lines the ranks up.
    #[arg(long, requires = "init_only")]
    pub(crate) unsynced: bool,
}

/// Which of the TCP backend's algorithms run.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Algorithm {
    Auto,
    #[value(alias = "direct")]
    Small,
    Ring,
}

/// How peers on this host are reached.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Transport {
    Unix,
    Tcp,
}

impl Args {
    /// The backend's options: the environment's (`CHORUS_SHM`, ...) with
    /// this command line's on top.
    fn tcp_options(&self) -> TcpOptions {
        let mut o = TcpOptions::from_env();
        match self.algorithm {
            Algorithm::Auto => {}
            Algorithm::Small => o.crossover_bytes = usize::MAX,
            Algorithm::Ring => o.crossover_bytes = 0,
        }
        if let Some(c) = self.chunk_bytes {
            o.chunk_bytes = c;
        }
        o.local_unix_sockets = matches!(self.transport, Transport::Unix);
        o
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.reform {
        // The ranks' tasks on two worker threads, as in a process of a
        // multi-threaded program.
        return tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(reform::run(&args));
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let opts = args.tcp_options();
            if args.init_only {
                return init::run(opts, !args.unsynced).await;
            }
            let pg = ProcessGroup::builder()
                .tcp_options(opts.clone())
                .init_from_env()
                .await?;
            for &bytes in &args.sizes {
                match args.timing {
                    measure::Timing::Barrier => measure::size(&pg, &args, &opts, bytes).await?,
                    measure::Timing::Loop => measure::size_loop(&pg, &args, &opts, bytes).await?,
                }
            }
            pg.shutdown().await?;
            Ok(())
        })
}
