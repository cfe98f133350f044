//! The recursive-doubling all_reduce schedule: `log2 p` pairwise exchanges
//! among the `p` ranks of the largest power of two not above `n` (the
//! core), with each of the `n - p` extra ranks folded into a core rank
//! before (its buffer sent there and reduced) and given the result after.
//!
//! Every reduction takes the lower rank's operand first, whichever rank
//! computes it, so partners compute the same bits and every rank ends with
//! the same result.

/// One step of rank `me`'s part of the all_reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send this rank's buffer to `to` (an extra rank folding into its
    /// core rank).
    Send { to: usize },
    /// Receive `from`'s buffer and reduce it into this rank's (`from` is
    /// the higher rank: this rank's operand comes first).
    Fold { from: usize },
    /// Send this rank's buffer to `peer`, receive `peer`'s, and reduce
    /// them, the lower rank's operand first.
    Exchange { peer: usize },
    /// Receive the result from `from` in place of this rank's buffer.
    Result { from: usize },
}

/// The largest power of two not above `n` (`n >= 1`).
pub(crate) fn core_size(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The steps of rank `me` of `n`, in order.
pub(crate) fn all_reduce(me: usize, n: usize) -> Vec<Step> {
    let p = core_size(n);
    if me >= p {
        return vec![Step::Send { to: me - p }, Step::Result { from: me - p }];
    }
    let extra = (me + p < n).then_some(me + p);
    let mut steps = Vec::new();
    if let Some(e) = extra {
        steps.push(Step::Fold { from: e });
    }
    let mut d = 1;
    while d < p {
        steps.push(Step::Exchange { peer: me ^ d });
        d <<= 1;
    }
    if let Some(e) = extra {
        steps.push(Step::Send { to: e });
    }
    steps
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, VecDeque};

    use super::*;

    /// Runs every rank's schedule on symbolic values (the expression each
    /// rank holds), sends never blocking, receives in order per pair;
    /// panics if a rank is stuck.
    fn simulate(n: usize) -> Vec<String> {
        let scheds: Vec<Vec<Step>> = (0..n).map(|r| all_reduce(r, n)).collect();
        let mut val: Vec<String> = (0..n).map(|r| format!("x{r}")).collect();
        let mut pc = vec![0usize; n];
        let mut posted = vec![false; n];
        let mut wire: HashMap<(usize, usize), VecDeque<String>> = HashMap::new();
        let mut progress = true;
        while progress {
            progress = false;
            for r in 0..n {
                let Some(&s) = scheds[r].get(pc[r]) else {
                    continue;
                };
                let (send_to, recv_from) = match s {
                    Step::Send { to } => (Some(to), None),
                    Step::Fold { from } | Step::Result { from } => (None, Some(from)),
                    Step::Exchange { peer } => (Some(peer), Some(peer)),
                };
                if let (Some(to), false) = (send_to, posted[r]) {
                    wire.entry((r, to)).or_default().push_back(val[r].clone());
                    posted[r] = true;
                    progress = true;
                }
                if let Some(from) = recv_from {
                    let Some(v) = wire.get_mut(&(from, r)).and_then(VecDeque::pop_front) else {
                        continue;
                    };
                    val[r] = match s {
                        Step::Result { .. } => v,
                        _ if r < from => format!("({} {v})", val[r]),
                        _ => format!("({v} {})", val[r]),
                    };
                }
                pc[r] += 1;
                posted[r] = false;
                progress = true;
            }
        }
        for (r, s) in scheds.iter().enumerate() {
            assert_eq!(pc[r], s.len(), "rank {r} of {n} is stuck");
        }
        assert!(
            wire.values().all(VecDeque::is_empty),
            "n={n}: a frame nobody read"
        );
        val
    }

    #[test]
    fn every_rank_ends_with_the_same_expression_of_every_input_once() {
        for n in 1..=17 {
            let v = simulate(n);
            for (r, e) in v.iter().enumerate() {
                assert_eq!(e, &v[0], "n={n} rank {r}");
            }
            let mut inputs: Vec<usize> = v[0]
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter_map(|t| t.strip_prefix('x'))
                .map(|t| t.parse().expect("a rank"))
                .collect();
            inputs.sort_unstable();
            assert_eq!(inputs, (0..n).collect::<Vec<_>>(), "n={n}: {}", v[0]);
        }
    }

    #[test]
    fn rounds_are_logarithmic() {
        assert_eq!(core_size(1), 1);
        assert_eq!(core_size(17), 16);
        assert_eq!(core_size(256), 256);
        for n in 1..=300 {
            let p = core_size(n);
            for r in 0..n {
                let steps = all_reduce(r, n).len();
                assert!(
                    steps <= p.trailing_zeros() as usize + 2,
                    "n={n} rank {r}: {steps}"
                );
            }
        }
    }
}
