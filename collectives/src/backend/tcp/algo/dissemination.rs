//! The dissemination barrier's schedule: in round `k` every rank sends to
//! the rank `2^k` after it and receives from the rank `2^k` before it;
//! after `ceil(log2 n)` rounds every rank has heard, directly or not, from
//! every other.

/// Rank `me`'s rounds of the barrier of `n` ranks: `(to, from)` each.
pub(crate) fn barrier(me: usize, n: usize) -> Vec<(usize, usize)> {
    let mut rounds = Vec::new();
    let mut d = 1;
    while d < n {
        rounds.push(((me + d) % n, (me + n - d) % n));
        d <<= 1;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which ranks each rank has heard from after every round.
    #[test]
    fn every_rank_hears_from_every_rank() {
        for n in 1..=33 {
            let mut heard: Vec<Vec<bool>> =
                (0..n).map(|r| (0..n).map(|p| p == r).collect()).collect();
            let rounds: Vec<_> = (0..n).map(|r| barrier(r, n)).collect();
            for k in 0..rounds[0].len() {
                let before = heard.clone();
                for (r, mine) in rounds.iter().enumerate() {
                    let (to, from) = mine[k];
                    assert_eq!(
                        rounds[from][k].0, r,
                        "n={n}: the sender of round {k} sends here"
                    );
                    assert_eq!(rounds[to][k].1, r);
                    for (h, b) in heard[r].iter_mut().zip(&before[from]) {
                        *h |= *b;
                    }
                }
            }
            assert!(heard.iter().all(|h| h.iter().all(|&b| b)), "n={n}");
            assert!(rounds[0].len() <= (n.max(1) as f64).log2().ceil() as usize);
        }
    }
}
