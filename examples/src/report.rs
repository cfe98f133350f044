//! The quickstart's report: every rank's timings and checks gathered on
//! every rank, the table rank 0 prints, and its one-line summary.

use std::time::Duration;

use chorus::ProcessGroup;

use crate::busbw::{Bandwidth, Collective};
use crate::latency::Latency;
use crate::timed::{Plan, Timed};

/// One op at one size, as this rank saw it.
#[derive(Debug)]
pub struct Row {
    /// The op.
    pub op: Collective,
    /// Bytes of each rank's part (see `Collective::counted_bytes`).
    pub part: usize,
    /// What this rank saw of its iterations.
    pub timed: Timed,
}

/// The row of `op` on parts of `len` f32 elements.
pub fn row(op: Collective, len: usize, timed: Timed) -> Row {
    Row {
        op,
        part: len * 4,
        timed,
    }
}

/// Every rank's rows, gathered on every rank.
#[derive(Debug)]
pub struct Report {
    n: usize,
    backend: &'static str,
    plan: Plan,
    rows: Vec<Row>,
    /// Per row: the slowest rank's latency per iteration.
    latency: Vec<Option<Latency>>,
    /// Per row: results checked and wrong, summed over the ranks.
    checks: Vec<(u64, u64)>,
}

/// Gathers every rank's `rows` (run with `plan`) on every rank: each rank
/// must call it with the same ops in the same order.
///
/// # Errors
///
/// The all_gather that failed.
pub async fn gather(
    pg: &ProcessGroup,
    plan: Plan,
    rows: Vec<Row>,
) -> Result<Report, chorus::Error> {
    let n = pg.size();
    let times: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.timed.times.iter().copied())
        .collect();
    let counts: Vec<u64> = rows
        .iter()
        .flat_map(|r| [r.timed.checked, r.timed.wrong])
        .collect();
    let (per_rank_times, per_rank_counts) = (times.len(), counts.len());
    let (_, times) = pg.all_gather(times, vec![0.0; n * per_rank_times])?.await?;
    let (_, counts) = pg.all_gather(counts, vec![0; n * per_rank_counts])?.await?;
    let iters = plan.iters;
    let latency = (0..rows.len())
        .map(|k| {
            let of_row: Vec<f64> = (0..n)
                .flat_map(|r| &times[r * per_rank_times + k * iters..][..iters])
                .copied()
                .collect();
            Latency::across_ranks(&of_row, n, iters)
        })
        .collect();
    let checks = (0..rows.len())
        .map(|k| {
            (0..n).fold((0, 0), |(c, w), r| {
                let at = r * per_rank_counts + 2 * k;
                (c + counts[at], w + counts[at + 1])
            })
        })
        .collect();
    Ok(Report {
        n,
        backend: pg.backend_name(),
        plan,
        rows,
        latency,
        checks,
    })
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn ranks(n: usize) -> String {
    if n == 1 {
        "1 rank".to_owned()
    } else {
        format!("{n} ranks")
    }
}

fn fmt_time(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1e4 {
        format!("{:.1} ms", us / 1e3)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

impl Report {
    fn bandwidth(&self, k: usize) -> Option<Bandwidth> {
        let r = &self.rows[k];
        let bytes = r.op.counted_bytes(r.part, self.n);
        Bandwidth::of(r.op, self.n, bytes, self.latency[k]?.median)
    }

    /// Results found wrong, on all ranks together.
    pub fn wrong(&self) -> u64 {
        self.checks.iter().map(|&(_, w)| w).sum()
    }

    /// Prints the table, its notes and the summary line.
    pub fn print(&self) {
        let Plan {
            warmup,
            iters,
            check_all,
        } = self.plan;
        let checked = if check_all {
            "every result checked"
        } else {
            "the warm-ups' and the last one's results checked"
        };
        println!(
            "chorus quickstart: {}, backend {}, f32; per op and size {warmup} warm-up + {iters} timed iterations, {checked}",
            ranks(self.n),
            self.backend
        );
        println!(
            "{:<15} {:>10} {:>10} {:>10} {:>11} {:>11}  checked",
            "op", "size", "median", "p99", "algbw", "busbw"
        );
        for (k, r) in self.rows.iter().enumerate() {
            let size = match r.op {
                Collective::Barrier => "-".to_owned(),
                op => human(op.counted_bytes(r.part, self.n)),
            };
            let (median, p99) = self.latency[k]
                .map(|l| (fmt_time(l.median), fmt_time(l.p99)))
                .unwrap_or(("-".into(), "-".into()));
            let (algbw, busbw) = self
                .bandwidth(k)
                .map(|b| {
                    (
                        format!("{:.3} GB/s", b.algbw),
                        format!("{:.3} GB/s", b.busbw),
                    )
                })
                .unwrap_or(("-".into(), "-".into()));
            let checked = match self.checks[k] {
                (0, _) => "-".to_owned(),
                (c, 0) => format!("{c} OK"),
                (c, w) => format!("{w} of {c} WRONG"),
            };
            println!(
                "{:<15} {size:>10} {median:>10} {p99:>10} {algbw:>11} {busbw:>11}  {checked}",
                r.op.name()
            );
        }
        println!(
            "latency: the slowest rank's time per iteration, every iteration starting after a \
             barrier; p99 is the slowest iteration when fewer than 100 are timed"
        );
        println!(
            "size (as nccl-tests counts it): the buffer; all n ranks' parts for all_gather (its output), \
             reduce_scatter and all_to_all (their input)"
        );
        println!(
            "busbw = algbw × 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter, all_to_all), \
             1 (broadcast, reduce, send/recv)"
        );
        println!("{}", self.summary());
    }

    fn summary(&self) -> String {
        let sizes = self
            .rows
            .iter()
            .filter(|r| r.op == Collective::AllReduce)
            .count();
        let ops = (self.rows.len() - 1) / sizes.max(1);
        let checked: u64 = self.checks.iter().map(|&(c, _)| c).sum();
        let verdict = match self.wrong() {
            0 => format!("all {checked} results match the serial reference"),
            w => format!("{w} of {checked} results WRONG"),
        };
        let largest = (0..self.rows.len())
            .rev()
            .find(|&k| self.rows[k].op == Collective::AllReduce);
        let headline = largest
            .and_then(|k| {
                let (l, b) = (self.latency[k]?, self.bandwidth(k)?);
                Some(format!(
                    "; all_reduce {}: median {}, p99 {}, busbw {:.2} GB/s",
                    human(self.rows[k].part),
                    fmt_time(l.median),
                    fmt_time(l.p99),
                    b.busbw
                ))
            })
            .unwrap_or_default();
        format!(
            "quickstart: {ops} ops × {sizes} sizes and barrier on {} ({}): {verdict}{headline}",
            ranks(self.n),
            self.backend
        )
    }
}
