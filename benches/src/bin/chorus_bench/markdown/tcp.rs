//! The TCP all_reduce comparison's section of the report.

use std::fmt::Write as _;

use crate::cli::Plan;
use crate::format::{fmt_bytes, fmt_gbps, fmt_us, skipped_cell, yes_no};
use crate::run::TcpRanks;

/// Small messages are judged on latency, large ones on bus bandwidth.
const SMALL_MAX: usize = 64 << 10;
const LARGE_MIN: usize = 16 << 20;

pub(crate) fn tcp_section(t: &TcpRanks, plan: &Plan, plots: Option<&str>, md: &mut String) {
    let n = t.ranks;
    let _ = writeln!(
        md,
        "### TCP backend beside Gloo: all_reduce f32, {n} ranks\n"
    );
    if let Some(e) = &t.error {
        let _ = writeln!(md, "Not run: {e}\n");
        return;
    }
    let _ = writeln!(
        md,
        "One process per rank on this machine, loopback (`chorus-run … tcp_allreduce` / `gloo_allreduce.py`). \
         Per run and size: {} warm-up ops, then up to {} timed ops (time budget {} s, at least 5), each \
         after a barrier, timed as the slowest rank's; the median and p99 of those, then the median of \
         {} runs. Bus bandwidth = bytes × 2(n−1)/n / median. Latency ratio = Gloo's / ours, bandwidth \
         ratio = ours / Gloo's (> 1: chorus is better). Targets: up to {} latency ≤ 1/5 of \
         Gloo's (ratio ≥ 5×); from {} bus bandwidth ≥ 2× Gloo's.\n",
        plan.warmup,
        plan.iters,
        plan.budget_s,
        plan.reps,
        fmt_bytes(SMALL_MAX),
        fmt_bytes(LARGE_MIN)
    );
    if let Some(s) = &t.anchor_skipped {
        let _ = writeln!(md, "Gloo anchor skipped: {s}.\n");
    }
    let _ = writeln!(
        md,
        "| size | ours median | ours p99 | Gloo median | Gloo p99 | latency ratio | ours busbw GB/s | Gloo busbw GB/s | busbw ratio | target | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    for o in &t.ours {
        let a = t.anchor.iter().find(|a| a.bytes == o.bytes);
        let (target, want_lat, want_bw) = if o.bytes <= SMALL_MAX {
            ("latency ≥ 5×", true, false)
        } else if o.bytes >= LARGE_MIN {
            ("busbw ≥ 2×", false, true)
        } else {
            ("—", false, false)
        };
        let (am, ap, lr, ab, br, met) = match a {
            Some(a) => {
                let lr = a.median_us / o.median_us;
                let br = o.busbw_gbps / a.busbw_gbps;
                let met = if want_lat {
                    yes_no(lr >= 5.0)
                } else if want_bw {
                    yes_no(br >= 2.0)
                } else {
                    "—".into()
                };
                (
                    fmt_us(a.median_us),
                    fmt_us(a.p99_us),
                    format!("{lr:.2}×"),
                    fmt_gbps(a.busbw_gbps),
                    format!("{br:.2}×"),
                    met,
                )
            }
            None => {
                let s = skipped_cell(t.anchor_skipped.as_deref().or(Some("")));
                (s.clone(), s.clone(), "—".into(), s, "—".into(), "—".into())
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {am} | {ap} | {lr} | {} | {ab} | {br} | {target} | {met} |",
            fmt_bytes(o.bytes),
            fmt_us(o.median_us),
            fmt_us(o.p99_us),
            fmt_gbps(o.busbw_gbps)
        );
    }
    md.push('\n');
    if let Some(p) = plots {
        let _ = writeln!(
            md,
            "![all_reduce latency, {n} ranks]({p}/tcp_allreduce_latency_{n}ranks.svg)\n\
             ![all_reduce bus bandwidth, {n} ranks]({p}/tcp_allreduce_busbw_{n}ranks.svg)\n"
        );
    }
}
