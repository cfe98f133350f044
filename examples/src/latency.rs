//! Per-iteration latency across ranks, counted as chorus's benchmarks
//! (`tcp_allreduce`) count it: every iteration starts after a barrier, takes
//! as long as its slowest rank, and the median and p99 are taken over the
//! iterations.

use std::time::Duration;

/// Median and p99 of one op's timed iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    /// The median iteration.
    pub median: Duration,
    /// The 99th percentile (the slowest iteration when there are fewer than
    /// a hundred).
    pub p99: Duration,
    /// How many iterations were timed.
    pub iters: usize,
}

impl Latency {
    /// The latency of `iters` iterations on `ranks` ranks from every rank's
    /// times in seconds, rank-major (`times[r * iters + i]` is rank `r`'s
    /// time of iteration `i`, as an all_gather of each rank's times lays
    /// them out). `None` when no iteration was timed.
    ///
    /// # Panics
    ///
    /// If `times` does not hold `ranks × iters` values.
    pub fn across_ranks(times: &[f64], ranks: usize, iters: usize) -> Option<Self> {
        assert_eq!(times.len(), ranks * iters, "times of every rank");
        if iters == 0 {
            return None;
        }
        let mut per_iter: Vec<Duration> = (0..iters)
            .map(|i| {
                let slowest = (0..ranks).map(|r| times[r * iters + i]).fold(0.0, f64::max);
                Duration::from_secs_f64(slowest)
            })
            .collect();
        per_iter.sort();
        Some(Latency {
            median: percentile(&per_iter, 0.5),
            p99: percentile(&per_iter, 0.99),
            iters,
        })
    }
}

/// The `p` quantile of sorted durations, nearest rank (as `tcp_allreduce`).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_iteration_takes_as_long_as_its_slowest_rank() {
        // Two ranks, three iterations: rank 1 is slow in iteration 0 only.
        let times = [0.001, 0.002, 0.003, 0.010, 0.001, 0.001];
        let l = Latency::across_ranks(&times, 2, 3).unwrap();
        assert_eq!(l.median, Duration::from_secs_f64(0.003));
        assert_eq!(l.p99, Duration::from_secs_f64(0.010));
        assert_eq!(l.iters, 3);
    }

    #[test]
    fn no_iterations_is_no_latency() {
        assert_eq!(Latency::across_ranks(&[], 4, 0), None);
    }
}
