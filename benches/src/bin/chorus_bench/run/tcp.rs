//! Running the TCP all_reduce comparison: `tcp_allreduce` under
//! `chorus-run` beside Gloo, with the floor (a blocking Unix-socket
//! ping-pong of the small sizes) before each run.

use std::collections::BTreeMap;
use std::process::Command;

use crate::child::run;
use crate::cli::Plan;
use crate::env::Env;
use crate::parse::{add_runs, json_lines, median, merge_points, Point};
use crate::run::floor::pingpong;

/// Sizes up to this are small: judged on latency, measured beside the
/// ping-pong floor.
pub(crate) const SMALL_MAX: usize = 64 << 10;

#[derive(Debug, Default)]
pub(crate) struct TcpRanks {
    pub(crate) ranks: usize,
    pub(crate) ours: Vec<Point>,
    pub(crate) anchor: Vec<Point>,
    /// The Unix-socket ping-pong's median round trip by size (µs), the
    /// median over runs; small sizes only.
    pub(crate) floor_us: BTreeMap<usize, f64>,
    pub(crate) anchor_skipped: Option<String>,
    pub(crate) error: Option<String>,
}

pub(crate) fn bench_tcp(env: &Env, plan: &Plan, ranks: usize) -> TcpRanks {
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
    let small: Vec<usize> = plan
        .sizes
        .iter()
        .copied()
        .filter(|&s| s <= SMALL_MAX)
        .collect();
    let budget = format!("{}", plan.budget_s);
    let (warmup, iters) = (plan.warmup.to_string(), plan.iters.to_string());
    let mut ours = BTreeMap::new();
    let mut anchor = BTreeMap::new();
    let mut floor = BTreeMap::new();
    for rep in 0..plan.reps {
        eprintln!(
            "tcp all_reduce, {ranks} ranks: run {}/{}",
            rep + 1,
            plan.reps
        );
        if !small.is_empty() {
            if let Err(e) = pingpong(env, plan, "unix", &small, &mut floor) {
                eprintln!("tcp: the floor did not run: {e}");
            }
        }
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
    r.floor_us = floor
        .iter()
        .filter_map(|(&b, v)| Some((b, median(v)?)))
        .collect();
    r
}
