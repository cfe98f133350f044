//! Which algorithm an op runs, by its size and the group's: below
//! `crossover_bytes` the direct ones in groups of at most
//! [`DIRECT_MAX_RANKS`] (one round to every rank beats `log2 n` dependent
//! rounds there) and the logarithmic ones above (few rounds, each
//! carrying the whole small buffer); from `crossover_bytes` the ring
//! (every rank sends about twice its buffer, to its neighbour only).
//! Every rank computes the same choice from the same arguments, and the
//! frames' algorithm field catches one that did not.

/// The largest group whose small ops run the direct algorithms, measured
/// with `tcp_allreduce` (`--algorithm small`, with this constant moved):
/// the point where the direct all_reduce stops being faster than
/// recursive doubling and starts costing more CPU time.
pub(crate) const DIRECT_MAX_RANKS: usize = 8;

/// Whether the small ops of a group of `n` run the direct algorithms.
pub(crate) fn direct(n: usize) -> bool {
    n <= DIRECT_MAX_RANKS
}

/// How an all_reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllReduce {
    /// One rank: nothing to exchange.
    Alone,
    /// Every rank to every rank (`run_direct`).
    Direct,
    /// Recursive doubling (`doubling`).
    Doubling,
    /// The ring's reduce-scatter, then the owners' blocks through their
    /// broadcast segments (every rank on one host, more than 2 ranks).
    RingThenBroadcastSegments,
    /// The pipelined ring: reduce-scatter, then all-gather.
    Ring,
}

/// Whether an op of `bytes` runs the large algorithms.
pub(crate) fn large(bytes: usize, crossover: usize) -> bool {
    bytes >= crossover
}

/// The all_reduce of `bytes` among `n` ranks; `all_local`: every rank is
/// on this host with shared memory (only looked at for a large op of more
/// than 2 ranks).
pub(crate) fn all_reduce(n: usize, bytes: usize, crossover: usize, all_local: bool) -> AllReduce {
    if n == 1 {
        AllReduce::Alone
    } else if !large(bytes, crossover) && direct(n) {
        AllReduce::Direct
    } else if !large(bytes, crossover) {
        AllReduce::Doubling
    } else if n > 2 && all_local {
        AllReduce::RingThenBroadcastSegments
    } else {
        AllReduce::Ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_is_direct_or_doubling_large_is_a_ring() {
        let x = 64 << 10;
        assert_eq!(all_reduce(1, 4, x, true), AllReduce::Alone);
        assert_eq!(all_reduce(4, 4, x, true), AllReduce::Direct);
        assert_eq!(all_reduce(8, 4, x, true), AllReduce::Direct);
        assert_eq!(all_reduce(9, 4, x, true), AllReduce::Doubling);
        assert_eq!(all_reduce(16, x - 1, x, true), AllReduce::Doubling);
        assert_eq!(all_reduce(4, x, x, false), AllReduce::Ring);
        assert_eq!(
            all_reduce(4, x, x, true),
            AllReduce::RingThenBroadcastSegments
        );
        assert_eq!(all_reduce(2, x, x, true), AllReduce::Ring);
    }
}
