//! The checked mode's section of the report: each op's median with and
//! without `CHORUS_CHECK_OPS=1`, and their ratio.

use std::fmt::Write as _;

use crate::cli::Plan;
use crate::format::{fmt_bytes, fmt_us};
use crate::run::CheckedResult;

pub(crate) fn checked_section(r: &CheckedResult, plan: &Plan, md: &mut String) {
    let knobs = if plan.checked_args.is_empty() {
        "its defaults: 5 warm-up ops, up to 200 timed ops, 3 s a size".to_string()
    } else {
        format!("`{}`", plan.checked_args.join(" "))
    };
    let _ = writeln!(
        md,
        "What the checked mode (`CHORUS_CHECK_OPS=1`: every op's signature compared across ranks before \
         it runs) costs on the TCP backend: `chorus-run --nproc-per-node N -- tcp_allreduce --op OP --sizes \
         {}` ({knobs}), without and with `CHORUS_CHECK_OPS=1` in turn (the order alternating by round), \
         {} rounds; each cell the median over the rounds of the run's median (µs, the slowest rank's).\n",
        plan.checked_sizes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        plan.reps
    );
    let _ = writeln!(
        md,
        "| ranks | op | size | unchecked | checked | checked ÷ unchecked |"
    );
    let _ = writeln!(md, "|---:|---|---|---|---|---|");
    for ((ranks, op, bytes), a, b) in r.medians() {
        let _ = writeln!(
            md,
            "| {ranks} | {op} | {} | {} | {} | {:.2}× |",
            fmt_bytes(bytes),
            fmt_us(a),
            fmt_us(b),
            b / a
        );
    }
    md.push('\n');
}
