//! The store comparison's section of the report.

use std::fmt::Write as _;

use crate::format::{fmt_rate, skipped_cell, yes_no};
use crate::parse::median;
use crate::run::StoreResult;

pub(crate) fn store_section(r: &StoreResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "Round trips of 64-byte values over loopback, server in the client's process (`store_compare` / \
         `torch_store.py`), ops/s, median of {reps} runs. The anchor of every row is PyTorch with the same \
         number of clients (its client is synchronous: one op in flight). Ratio = ours / PyTorch's. \
         Target: get and add ≥ 10× PyTorch's, set ≥ 1×.\n"
    );
    match r.floor_per_s {
        Some(f) => {
            let _ = writeln!(
                md,
                "The floor, before each run: a blocking 64-byte loopback TCP ping-pong (`pingpong`, one thread \
                 per side), {} round trips/s; \"÷ floor\" is ours over that rate.\n",
                fmt_rate(f)
            );
        }
        None => {
            let _ = writeln!(md, "The floor (`pingpong`) did not run.\n");
        }
    }
    if let Some(s) = &r.anchor_skipped {
        let _ = writeln!(md, "PyTorch anchor skipped: {s}.\n");
    }
    let _ = writeln!(
        md,
        "| op | chorus clients × in flight | ours ops/s | ÷ floor | PyTorch ops/s | ratio | target | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for op in ["set", "get", "add"] {
        for (cfg, label, anchor_cfg) in [
            ("1", "1 × 1", "1"),
            ("16", "16 × 1", "16"),
            ("1x32", "1 × 32", "1"),
            ("1x128", "1 × 128", "1"),
        ] {
            let ours = r
                .ours
                .get(&(op.to_string(), cfg.to_string()))
                .and_then(|v| median(v));
            let Some(ours) = ours else { continue };
            let anchor = r
                .anchor
                .get(&(op.to_string(), anchor_cfg.to_string()))
                .and_then(|v| median(v));
            let want = if op == "set" { 1.0 } else { 10.0 };
            let (a, ratio, met) = match anchor {
                Some(a) if a > 0.0 => {
                    let x = ours / a;
                    (fmt_rate(a), format!("{x:.2}×"), yes_no(x >= want))
                }
                _ => (
                    skipped_cell(r.anchor_skipped.as_deref()),
                    "—".into(),
                    "—".into(),
                ),
            };
            let floor = r
                .floor_per_s
                .map_or("—".into(), |f| format!("{:.2}×", ours / f));
            let _ = writeln!(
                md,
                "| {op} | {label} | {} | {floor} | {a} | {ratio} | ≥ {want}× | {met} |",
                fmt_rate(ours)
            );
        }
    }
    md.push('\n');
}
