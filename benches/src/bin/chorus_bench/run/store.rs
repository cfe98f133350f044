//! Running the store comparison: chorus's `TcpStore` beside PyTorch's
//! `TCPStore`.

use std::process::Command;

use crate::child::run;
use crate::cli::Plan;
use crate::env::Env;
use crate::parse::{parse_rates, Rates};

#[derive(Debug, Default)]
pub(crate) struct StoreResult {
    pub(crate) ours: Rates,
    pub(crate) anchor: Rates,
    pub(crate) anchor_skipped: Option<String>,
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
