//! Running the checked mode's cost per op on the TCP backend:
//! `tcp_allreduce` under `chorus-run`, without and with
//! `CHORUS_CHECK_OPS=1` in turn, for broadcast and all_reduce.

use std::collections::BTreeMap;
use std::process::Command;

use crate::child::run;
use crate::cli::Plan;
use crate::env::Env;
use crate::parse::{json_lines, median};

/// The ops the checked suite measures, as `tcp_allreduce --op` names them.
pub(crate) const OPS: [&str; 2] = ["broadcast", "all_reduce"];

/// Medians by (ranks, op, bytes): one entry per round, unchecked and
/// checked.
pub(crate) type CheckedRuns = BTreeMap<(usize, String, usize), (Vec<f64>, Vec<f64>)>;

#[derive(Debug, Default)]
pub(crate) struct CheckedResult {
    pub(crate) runs: CheckedRuns,
    pub(crate) error: Option<String>,
}

impl CheckedResult {
    /// (unchecked, checked) medians over the rounds.
    pub(crate) fn medians(&self) -> Vec<((usize, String, usize), f64, f64)> {
        self.runs
            .iter()
            .filter_map(|(k, (a, b))| Some((k.clone(), median(a)?, median(b)?)))
            .collect()
    }
}

pub(crate) fn bench_checked(env: &Env, plan: &Plan) -> CheckedResult {
    let mut r = CheckedResult::default();
    let (launcher, bench) = match (env.bin("chorus-run"), env.bin("tcp_allreduce")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            r.error = Some(e);
            return r;
        }
    };
    let sizes: Vec<String> = plan.checked_sizes.iter().map(ToString::to_string).collect();
    let sizes = sizes.join(",");
    for round in 0..plan.reps {
        for &ranks in &plan.ranks {
            for op in OPS {
                // Unchecked first in even rounds, checked first in odd ones.
                let order = if round % 2 == 0 {
                    [false, true]
                } else {
                    [true, false]
                };
                for checked in order {
                    eprintln!(
                        "checked mode, {ranks} ranks, {op}, {}: round {}/{}",
                        if checked { "checked" } else { "unchecked" },
                        round + 1,
                        plan.reps
                    );
                    let mut cmd = Command::new(&launcher);
                    cmd.args(["--nproc-per-node", &ranks.to_string(), "--"])
                        .arg(&bench)
                        .args(["--op", op, "--sizes", &sizes])
                        .args(&plan.checked_args)
                        .env("CHORUS_CHECK_OPS", if checked { "1" } else { "0" });
                    let out = match run(&mut cmd, plan.timeout) {
                        Ok(o) => o,
                        Err(e) => {
                            r.error = Some(e);
                            return r;
                        }
                    };
                    for row in json_lines(&out.stdout) {
                        let f = |k: &str| row.get(k).and_then(serde_json::Value::as_f64);
                        let (Some(b), Some(m)) = (f("bytes"), f("median_us")) else {
                            continue;
                        };
                        let e = r
                            .runs
                            .entry((ranks, op.to_string(), b as usize))
                            .or_default();
                        if checked { &mut e.1 } else { &mut e.0 }.push(m);
                    }
                }
            }
        }
    }
    if r.runs.is_empty() {
        r.error = Some("tcp_allreduce printed no results".into());
    }
    r
}
