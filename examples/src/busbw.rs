//! Which bytes an op counts and how its bus bandwidth follows, as
//! nccl-tests defines them (its doc/PERFORMANCE.md).
//!
//! The algorithm bandwidth is the op's size over its time. The bus
//! bandwidth scales it by what each rank's link must carry, so that it can
//! be compared with the hardware's bandwidth whatever the number of ranks:
//!
//! | op | size counted | bus factor |
//! |---|---|---|
//! | all_reduce | the buffer | 2(n-1)/n |
//! | all_gather | the gathered output, n × each rank's input | (n-1)/n |
//! | reduce_scatter | the input, n × each rank's output | (n-1)/n |
//! | all_to_all | each rank's whole input, n chunks | (n-1)/n |
//! | broadcast, reduce, send/recv | the buffer | 1 |
//! | barrier | nothing | — |

use std::fmt;
use std::time::Duration;

/// The ops the quickstart measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// `all_reduce`.
    AllReduce,
    /// `broadcast`.
    Broadcast,
    /// `reduce`.
    Reduce,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_to_all`.
    AllToAll,
    /// A `send` to the next rank and a `recv` from the previous one.
    SendRecv,
    /// `barrier`.
    Barrier,
}

impl Collective {
    /// The op's name, as the `ProcessGroup` method is called.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::SendRecv => "send/recv",
            Collective::Barrier => "barrier",
        }
    }

    /// The bytes nccl-tests counts for this op on `n` ranks when each
    /// rank's own part (the buffer, the gathered input, the scattered
    /// output, one all_to_all chunk) has `part` bytes.
    pub fn counted_bytes(self, part: usize, n: usize) -> usize {
        match self {
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => part * n,
            Collective::Barrier => 0,
            _ => part,
        }
    }

    /// The factor from algorithm to bus bandwidth on `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (n - 1.0) / n
            }
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
            Collective::Barrier => 0.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Algorithm and bus bandwidth of one op, in GB/s (10⁹ bytes a second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    /// Counted bytes over the time.
    pub algbw: f64,
    /// `algbw` × the op's bus factor.
    pub busbw: f64,
}

impl Bandwidth {
    /// The bandwidth of `op` on `n` ranks moving `bytes` (as
    /// [`Collective::counted_bytes`] counts them) in `time`; `None` for an
    /// op that moves nothing or a zero time.
    pub fn of(op: Collective, n: usize, bytes: usize, time: Duration) -> Option<Self> {
        let secs = time.as_secs_f64();
        if bytes == 0 || secs <= 0.0 {
            return None;
        }
        let algbw = bytes as f64 / secs / 1e9;
        Some(Bandwidth {
            algbw,
            busbw: algbw * op.bus_factor(n),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_are_those_of_nccl_tests() {
        assert_eq!(Collective::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(Collective::AllToAll.bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Collective::SendRecv.bus_factor(3), 1.0);
    }

    #[test]
    fn gathered_ops_count_the_whole_buffer() {
        assert_eq!(Collective::AllGather.counted_bytes(4096, 4), 16384);
        assert_eq!(Collective::AllReduce.counted_bytes(4096, 4), 4096);
        assert_eq!(Collective::Barrier.counted_bytes(4096, 4), 0);
    }

    #[test]
    fn one_gigabyte_in_one_second_is_one_gb_per_s() {
        let bw = Bandwidth::of(
            Collective::AllReduce,
            4,
            1_000_000_000,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(bw.algbw, 1.0);
        assert_eq!(bw.busbw, 1.5);
        assert!(Bandwidth::of(Collective::Barrier, 4, 0, Duration::from_secs(1)).is_none());
    }
}
