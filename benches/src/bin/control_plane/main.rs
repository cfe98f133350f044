//! The control plane at scale: N simulated ranks (tokio tasks spread over
//! a few processes, each with its own connection to one store) run the
//! real rendezvous, communicator-id exchange, peer liveness and re-forming
//! quorum, without a data plane (`chorus::test_util::SimRank`).
//!
//! The parent serves the store (as chorus-run does) and measures:
//!
//! * form: from the start signal to every rank's liveness running;
//! * steady state: store requests and bytes per rank and liveness period,
//!   and the store's work per period (its time answering, and the CPU time
//!   of the process that serves it);
//! * detect: from stopping one rank (it stops beating without leaving, as
//!   SIGSTOP or a kill) to every other rank's pending work failing with
//!   `PeerSilent` naming it;
//! * re-form: from the stop to every survivor holding the next epoch's
//!   roster and running its liveness there.
//!
//! Prints one line per phase and one JSON line (`{"control_plane": ...}`)
//! on stdout. Timeouts bound every wait: a phase that does not finish
//! fails the run, naming it.
#![forbid(unsafe_code)]

mod child;
mod host;
mod parent;

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(about = "control plane of N simulated ranks: form, steady state, detect, re-form")]
pub(crate) struct Args {
    /// Simulated ranks.
    #[arg(long, default_value_t = 1024)]
    ranks: usize,
    /// Processes the ranks are spread over (rank r runs in process r % procs).
    #[arg(long, default_value_t = 4)]
    procs: usize,
    /// Peer liveness timeout, in milliseconds.
    #[arg(long, default_value_t = 3_000)]
    liveness_ms: u64,
    /// Re-forming window, in milliseconds (the quorum's leader closes the
    /// roster when it passes, the stopped rank never announcing).
    #[arg(long, default_value_t = 500)]
    window_ms: u64,
    /// Liveness periods over which the steady state is measured.
    #[arg(long, default_value_t = 10)]
    periods: u32,
    /// Bound on each phase, in seconds.
    #[arg(long, default_value_t = 120)]
    phase_timeout_s: u64,
    /// Serve the store with PyTorch's TCPStore (libuv server) run by this
    /// Python instead of chorus's server; the ranks speak its protocol
    /// through chorus's TorchStore client. The server's own counters are
    /// then unknown: requests and busy time read 0, CPU is the Python
    /// process's.
    #[arg(long)]
    torch: Option<String>,
    /// Run as child process `i` of a parent (internal).
    #[arg(long, hide = true)]
    child: Option<usize>,
    /// The store's address (internal, for children).
    #[arg(long, hide = true)]
    addr: Option<String>,
}

fn main() {
    let args = Args::parse();
    raise_fd_limit();
    let r = match args.child {
        Some(i) => child::run(&args, i),
        None => parent::run(&args),
    };
    if let Err(e) = r {
        eprintln!("control_plane: {e}");
        std::process::exit(1);
    }
    // Skip the ranks' goodbyes: the parent measured what it wanted.
    std::process::exit(0);
}

/// Every simulated rank holds a socket: raise the soft limit on open files
/// to the hard one.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Milliseconds since the Unix epoch: the processes of one machine share
/// this clock, so a child can time from the parent's signal.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
