//! The TCP all_reduce comparison's section of the report: one table over
//! the rank counts, and the plots' links.

use std::fmt::Write as _;

use crate::cli::Plan;
use crate::format::{fmt_bytes, fmt_gbps, fmt_us, skipped_cell, yes_no};
use crate::run::{TcpRanks, SMALL_MAX};

/// From this size on a message is judged on bus bandwidth.
const LARGE_MIN: usize = 16 << 20;

/// The section for the rank counts that ran (`plots`: the plots' folder,
/// relative to the report, for the rank counts plotted).
pub(crate) fn tcp_section(
    all: &[&TcpRanks],
    plan: &Plan,
    plots: &[(usize, &str)],
    md: &mut String,
) {
    let _ = writeln!(
        md,
        "One process per rank on this machine (`chorus-run … tcp_allreduce` / `gloo_allreduce.py`: Unix \
         sockets and shared memory / loopback TCP). Per run and size: {} warm-up ops, then up to {} timed \
         ops (time budget {} s, at least 5), each after a barrier, timed as the slowest rank's; the median \
         and p99 of those, then the median of {} runs, chorus and Gloo alternating. Floor: a blocking \
         Unix-socket ping-pong of the same bytes (`pingpong`), before each run. CPU: all ranks' CPU time \
         per op, barrier included. Bus bandwidth = bytes × 2(n−1)/n / median. Ratio = Gloo's time / \
         ours (> 1: chorus is faster). Targets: up to {} latency ≤ 1/5 of Gloo's (ratio ≥ 5×); from {} \
         bus bandwidth ≥ 2× Gloo's.\n",
        plan.warmup,
        plan.iters,
        plan.budget_s,
        plan.reps,
        fmt_bytes(SMALL_MAX),
        fmt_bytes(LARGE_MIN)
    );
    for t in all {
        if let Some(s) = &t.anchor_skipped {
            let _ = writeln!(md, "Gloo anchor skipped ({} ranks): {s}.\n", t.ranks);
        }
    }
    let _ = writeln!(
        md,
        "| ranks | size | floor | ours median | ours p99 | ours busbw GB/s | ours CPU/op | Gloo median | Gloo p99 | Gloo busbw GB/s | ratio | target | met |"
    );
    let _ = writeln!(md, "|---:|---|---|---|---|---|---|---|---|---|---|---|---|");
    for t in all {
        for o in &t.ours {
            let a = t.anchor.iter().find(|a| a.bytes == o.bytes);
            let (target, want_lat, want_bw) = if o.bytes <= SMALL_MAX {
                ("latency ≥ 5×", true, false)
            } else if o.bytes >= LARGE_MIN {
                ("busbw ≥ 2×", false, true)
            } else {
                ("—", false, false)
            };
            let (am, ap, ab, ratio, met) = match a {
                Some(a) => {
                    // Same bytes and ranks: the bandwidth ratio is the
                    // time ratio.
                    let r = a.median_us / o.median_us;
                    let met = if want_lat {
                        yes_no(r >= 5.0)
                    } else if want_bw {
                        yes_no(r >= 2.0)
                    } else {
                        "—".into()
                    };
                    (
                        fmt_us(a.median_us),
                        fmt_us(a.p99_us),
                        fmt_gbps(a.busbw_gbps),
                        format!("{r:.2}×"),
                        met,
                    )
                }
                None => {
                    let s = skipped_cell(t.anchor_skipped.as_deref().or(Some("")));
                    (s.clone(), s.clone(), s, "—".into(), "—".into())
                }
            };
            let floor = t.floor_us.get(&o.bytes).map_or("—".into(), |&f| fmt_us(f));
            let cpu = if o.cpu_us.is_finite() {
                fmt_us(o.cpu_us)
            } else {
                "—".into()
            };
            let _ = writeln!(
                md,
                "| {} | {} | {floor} | {} | {} | {} | {cpu} | {am} | {ap} | {ab} | {ratio} | {target} | {met} |",
                t.ranks,
                fmt_bytes(o.bytes),
                fmt_us(o.median_us),
                fmt_us(o.p99_us),
                fmt_gbps(o.busbw_gbps)
            );
        }
    }
    md.push('\n');
    for (n, p) in plots {
        let _ = writeln!(
            md,
            "![all_reduce latency, {n} ranks]({p}/tcp_allreduce_latency_{n}ranks.svg)\n\
             ![all_reduce bus bandwidth, {n} ranks]({p}/tcp_allreduce_busbw_{n}ranks.svg)\n"
        );
    }
}
