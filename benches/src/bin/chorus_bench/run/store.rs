//! Running the store comparison: chorus's `TcpStore` beside PyTorch's
//! `TCPStore`, with the floor (a blocking 64-byte loopback TCP ping-pong)
//! before each run.

use std::collections::BTreeMap;
use std::process::Command;

use crate::child::run;
use crate::cli::Plan;
use crate::env::Env;
use crate::parse::{median, parse_rates, Rates};
use crate::run::floor::pingpong;

/// A request's size in the store runs, and so the floor's.
const REQUEST_BYTES: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct StoreResult {
    pub(crate) ours: Rates,
    pub(crate) anchor: Rates,
    pub(crate) anchor_skipped: Option<String>,
    /// Round trips per second of the floor (median of the runs), if it ran.
    pub(crate) floor_per_s: Option<f64>,
    pub(crate) error: Option<String>,
}

pub(crate) fn bench_store(env: &Env, plan: &Plan) -> StoreResult {
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
    let mut floor = BTreeMap::new();
    for rep in 0..plan.reps {
        eprintln!("store: run {}/{}", rep + 1, plan.reps);
        if let Err(e) = pingpong(env, plan, "tcp", &[REQUEST_BYTES], &mut floor) {
            eprintln!("store: the floor did not run: {e}");
        }
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
    r.floor_per_s = floor
        .get(&REQUEST_BYTES)
        .and_then(|v| median(v))
        .filter(|us| *us > 0.0)
        .map(|us| 1e6 / us);
    r
}
