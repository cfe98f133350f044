//! Which algorithm an op runs, by its size: below `crossover_bytes` the
//! logarithmic ones (few rounds, each carrying the whole small buffer),
//! from there the ring (every rank sends about twice its buffer, to its
//! neighbour only). Every rank computes the same choice from the same
//! arguments, and the frames' algorithm field catches one that did not.

/// How an all_reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllReduce {
    /// One rank: nothing to exchange.
    Alone,
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
    fn small_is_doubling_large_is_a_ring() {
        let x = 64 << 10;
        assert_eq!(all_reduce(1, 4, x, true), AllReduce::Alone);
        assert_eq!(all_reduce(4, 4, x, true), AllReduce::Doubling);
        assert_eq!(all_reduce(4, x - 1, x, true), AllReduce::Doubling);
        assert_eq!(all_reduce(4, x, x, false), AllReduce::Ring);
        assert_eq!(
            all_reduce(4, x, x, true),
            AllReduce::RingThenBroadcastSegments
        );
        assert_eq!(all_reduce(2, x, x, true), AllReduce::Ring);
    }
}
