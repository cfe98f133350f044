//! The NCCL comparisons' sections of the report (written only when the
//! comparison ran: `NcclResult::skipped` and `groups_skipped` are `None`).

use std::fmt::Write as _;

use serde_json::Value;

use crate::format::{skipped_cell, yes_no};
use crate::parse::{group_med, med_at};
use crate::run::NcclResult;

/// chorus beside the raw NCCL/CUDA calls it is built from: what the
/// layers above NCCL cost per op.
pub(crate) fn raw_section(r: &NcclResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "Median of {reps} runs. Enqueue and round trip: one 1 MiB f32 all_reduce (`group_bench`, width 1: \
         chorus `all_reduce` + `.await` vs a bare `ncclAllReduce` + `cuStreamSynchronize`); stream-ordered \
         wait: `DeviceWork::stream_ordered()` vs a bare `cuEventRecord` + `cuStreamWaitEvent` \
         (`nccl_bench`). Ratio = chorus ÷ raw (the price of the layers above NCCL).\n"
    );
    let _ = writeln!(md, "| figure | chorus | raw NCCL / CUDA | ratio |");
    let _ = writeln!(md, "|---|---|---|---|");
    let num = |k: &'static str| move |v: &Value| v.get(k).and_then(Value::as_f64);
    let rows = [
        (
            "enqueue of one all_reduce (µs)",
            group_med(&r.groups, 1, "chorus_seq", "submit_us"),
            group_med(&r.groups, 1, "raw_seq", "submit_us"),
        ),
        (
            "round trip: issue until the GPU finished and the host knows (µs)",
            group_med(&r.groups, 1, "chorus_seq", "total_us"),
            group_med(&r.groups, 1, "raw_seq", "total_us"),
        ),
        (
            "stream-ordered wait (µs)",
            med_at(&r.ours, num("stream_ordered_median_us")),
            med_at(&r.ours, num("record_wait_us")),
        ),
    ];
    for (label, c, w) in rows {
        let f = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.2}"));
        let ratio = c
            .zip(w)
            .map_or("—".to_string(), |(c, w)| format!("{:.1}×", c / w));
        let _ = writeln!(md, "| {label} | {} | {} | {ratio} |", f(c), f(w));
    }
    let _ = writeln!(
        md,
        "| wake latency (end event complete → future woken) | see the table above | no waker (poll or block) | — |\n"
    );
}

pub(crate) fn groups_section(r: &NcclResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "`group_bench --json` (chorus: ops one by one, a group of ops, and `all_reduce_coalesced`; raw \
         `ncclAllReduce` in a loop and inside `ncclGroupStart/End`; \"raw + events\": the same raw calls \
         plus the input-ready record, stream wait and end record per op / per group (two events per launch), the floor \
         of any library that keeps that rule) and `torch_coalesce.py --json` (async `all_reduce`s; \
         `_coalescing_manager`), 1 MiB f32 each, median of {reps} runs of medians; total = submit until the \
         GPU finished, in µs. Target: chorus within 1.3× of raw NCCL, sequential and grouped \
         (judged on the total; grouped: the better of chorus's group and coalesced op).\n"
    );
    let _ = writeln!(
        md,
        "| width | chorus seq | chorus grouped | chorus coalesced | raw seq | raw grouped | raw + events seq / grouped | PyTorch seq | PyTorch coalesced | chorus ÷ raw (seq / grouped) | floor ÷ raw (seq / grouped) | met |"
    );
    let _ = writeln!(
        md,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let widths: Vec<u64> = r
        .groups
        .first()
        .and_then(|v| v.get("rows")?.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|row| row.get("width")?.as_u64())
        .collect();
    let cell = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.1}"));
    let times = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.1}×"));
    for w in widths {
        let t = |who| group_med(&r.groups, w, who, "total_us");
        let a = |who| group_med(&r.groups_anchor, w, who, "total_us");
        let (cs, cg, cc, rs, rg, es, eg) = (
            t("chorus_seq"),
            t("chorus_grouped"),
            t("chorus_coalesced"),
            t("raw_seq"),
            t("raw_grouped"),
            t("raw_events_seq"),
            t("raw_events_grouped"),
        );
        let best_grouped = match (cg, cc) {
            (Some(g), Some(c)) => Some(g.min(c)),
            (g, c) => g.or(c),
        };
        let ratio = |c: Option<f64>, r: Option<f64>| c.zip(r).map(|(c, r)| c / r);
        let (qs, qg) = (ratio(cs, rs), ratio(best_grouped, rg));
        let met = match (qs, qg) {
            (Some(a), Some(b)) => yes_no(a <= 1.3 && b <= 1.3),
            _ => "—".into(),
        };
        let _ = writeln!(
            md,
            "| {w} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} / {} | {} / {} | {met} |",
            cell(cs),
            cell(cg),
            cell(cc),
            cell(rs),
            cell(rg),
            cell(es),
            cell(eg),
            cell(a("torch_seq")),
            cell(a("torch_coalesced")),
            times(qs),
            times(qg),
            times(ratio(es, rs)),
            times(ratio(eg, rg)),
        );
    }
    md.push('\n');
}

pub(crate) fn nccl_section(r: &NcclResult, reps: usize, md: &mut String) {
    let _ = writeln!(
        md,
        "Host-side costs of a small all_reduce (`nccl_bench --json` / `torch_nccl.py --json`), median of \
         {reps} runs. Ratio = PyTorch's time / ours (for round trips: ours / PyTorch's), > 1: chorus is \
         better. Targets.\n"
    );
    if let Some(s) = &r.anchor_skipped {
        let _ = writeln!(md, "PyTorch anchor skipped: {s}.\n");
    }
    let _ = writeln!(md, "| figure | ours | PyTorch | ratio | target | met |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let num = |k: &'static str| move |v: &Value| v.get(k).and_then(Value::as_f64);
    let rows: [(&str, &str, &str, f64, bool); 6] = [
        (
            "enqueue (all_reduce call), median",
            "enqueue_median_us",
            "enqueue_median_us",
            1.5,
            true,
        ),
        (
            "enqueue, p99",
            "enqueue_p99_us",
            "enqueue_p99_us",
            f64::NAN,
            true,
        ),
        (
            "stream-ordered wait, median (PyTorch: `work.wait()`)",
            "stream_ordered_median_us",
            "wait_median_us",
            1.0,
            true,
        ),
        (
            "stream-ordered wait, p99",
            "stream_ordered_p99_us",
            "wait_p99_us",
            f64::NAN,
            true,
        ),
        (
            "awaited round trips per second",
            "round_trips_per_s",
            "round_trips_per_s",
            3.0,
            false,
        ),
        (
            "round trips per second, blocking `wait_timeout` (PyTorch: as above)",
            "round_trips_wait_timeout_per_s",
            "round_trips_per_s",
            3.0,
            false,
        ),
    ];
    for (label, ok, ak, target, is_time) in rows {
        let Some(o) = med_at(&r.ours, num(ok)) else {
            continue;
        };
        let a = med_at(&r.anchor, num(ak));
        let ratio = a.map(|a| if is_time { a / o } else { o / a });
        let (tgt, met) = if target.is_nan() {
            ("—".to_string(), "—".to_string())
        } else if is_time {
            (format!("≤ {target} µs"), yes_no(o <= target))
        } else {
            (
                format!("≥ {target}× PyTorch's"),
                ratio.map_or("—".into(), |x| yes_no(x >= target)),
            )
        };
        let f = |v: f64| {
            if is_time {
                format!("{v:.2} µs")
            } else {
                format!("{v:.0}/s")
            }
        };
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {tgt} | {met} |",
            f(o),
            a.map_or(skipped_cell(r.anchor_skipped.as_deref().or(Some(""))), f),
            ratio.map_or("—".into(), |x| format!("{x:.2}×"))
        );
    }
    // Wake latency: PyTorch has no waker (its host callback arrives ~107 µs
    // after the event), so these are judged on the absolute targets.
    let wake_rows = r
        .ours
        .first()
        .and_then(|v| v.get("wake"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    for i in 0..wake_rows {
        let w = |k: &'static str| move |v: &Value| v.get("wake")?.get(i)?.get(k)?.as_f64();
        let (Some(spin), Some(pause)) = (
            med_at(&r.ours, w("spin_us")),
            med_at(&r.ours, w("observer_pause")),
        ) else {
            continue;
        };
        for (what, k, target) in [
            ("median", "wake_median_us", 5.0),
            ("p99", "wake_p99_us", 50.0),
        ] {
            if let Some(o) = med_at(&r.ours, w(k)) {
                let _ = writeln!(
                    md,
                    "| wake latency after a {spin:.0} µs kernel (observer pause {pause:.0}), {what} | {o:.2} µs | n/a (no waker) | — | ≤ {target} µs | {} |",
                    yes_no(o <= target)
                );
            }
        }
    }
    md.push('\n');
}
