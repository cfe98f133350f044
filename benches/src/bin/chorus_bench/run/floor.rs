//! The machine's floor for a small exchange, measured beside chorus in
//! the same run: `pingpong`, a blocking ping-pong over an abstract Unix
//! socket or loopback TCP, one thread per side.

use std::collections::BTreeMap;
use std::process::Command;

use crate::child::run;
use crate::cli::Plan;
use crate::env::Env;
use crate::parse::json_lines;

/// One `pingpong` run over `transport` at `sizes`: median round trip in µs
/// by size, added to `into` (one entry per run).
pub(crate) fn pingpong(
    env: &Env,
    plan: &Plan,
    transport: &str,
    sizes: &[usize],
    into: &mut BTreeMap<usize, Vec<f64>>,
) -> Result<(), String> {
    let bin = env.bin("pingpong")?;
    let sizes: Vec<String> = sizes.iter().map(ToString::to_string).collect();
    let mut cmd = Command::new(bin);
    cmd.args(["--transports", transport, "--sizes", &sizes.join(",")])
        .args(["--budget-s", &plan.floor_secs.to_string()]);
    let out = run(&mut cmd, plan.timeout)?;
    for row in json_lines(&out.stdout) {
        let bytes = row.get("bytes").and_then(serde_json::Value::as_u64);
        let us = row.get("median_us").and_then(serde_json::Value::as_f64);
        if let (Some(b), Some(us)) = (bytes, us) {
            into.entry(b as usize).or_default().push(us);
        }
    }
    Ok(())
}
