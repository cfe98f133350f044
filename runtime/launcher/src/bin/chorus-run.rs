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
//! names, so `chorus::rendezvous::init_from_env` finds them), stdin
//! from /dev/null, and its stdout/stderr lines prefixed with `[rank R] `.
//! SIGINT, SIGTERM and SIGHUP are forwarded to every rank; a second one
//! kills them.
//! When a rank fails, the others get SIGTERM and, after `--kill-timeout`
//! seconds, SIGKILL; chorus-run then exits with the failing rank's code
//! (128+N for a rank killed by signal N); with `--keep-going` the others
//! run on and it exits with the first failing code once all are done. See
//! `chorus-run --help`. The logic lives in `chorus_launcher`.
#![forbid(unsafe_code)]

fn main() {
    std::process::exit(chorus_launcher::main_from_args(std::env::args_os()));
}
