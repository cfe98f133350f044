//! chorus-run: starts N local ranks of a program with the torchrun
//! environment.
//!
//! ```text
//! chorus-run --nproc-per-node N [--nnodes K --node-rank I --master-addr A --master-port P] \
//!            [--kill-timeout SECS] -- PROGRAM ARGS...
//! ```
//!
//! Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//! GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun's
//! names, so `chorus_runtime::rendezvous::init_from_env` finds them), stdin
//! from /dev/null, and its stdout/stderr lines prefixed with `[rank R] `.
//! SIGINT, SIGTERM and SIGHUP are forwarded to every rank; a second one
//! kills them.
//! When a rank fails, the others get SIGTERM and, after `--kill-timeout`
//! seconds, SIGKILL; chorus-run then exits with the failing rank's code
//! (128+N for a rank killed by signal N). See `chorus-run --help`.

mod cli;
mod output;
mod supervise;

use clap::Parser;

fn main() {
    let args = cli::Args::parse();
    let plan = match cli::Plan::from_args(&args) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("chorus-run: {msg}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chorus-run: cannot start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(supervise::run(args, plan));
    drop(rt);
    std::process::exit(code);
}
