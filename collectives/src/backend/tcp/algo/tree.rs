//! The binomial tree of the rooted ops: ranks renumbered from the root
//! (`v = (rank - root) mod n`), the parent of `v > 0` is `v` without its
//! highest bit, and the children of `v` are `v + 2^k` for every `2^k > v`
//! below `n`. A broadcast goes down it (largest subtree first), a reduce
//! up it; each rank talks to at most `ceil(log2 n) + 1` others, and the
//! depth is `ceil(log2 n)`.

/// Rank `me`'s place in the tree of `n` ranks rooted at `root`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    /// The rank this one receives from (broadcast) or sends to (reduce).
    pub(crate) parent: Option<usize>,
    /// The ranks this one sends to (broadcast) or receives from (reduce),
    /// smallest subtree first.
    pub(crate) children: Vec<usize>,
}

/// Rank `me`'s node in the binomial tree of `n` ranks rooted at `root`.
pub(crate) fn node(me: usize, n: usize, root: usize) -> Node {
    let v = (me + n - root) % n;
    let rank = |v: usize| (v + root) % n;
    let parent = (v > 0).then(|| rank(v - (1 << (usize::BITS - 1 - v.leading_zeros()))));
    let mut children = Vec::new();
    let mut d = 1;
    while v + d < n {
        if d > v {
            children.push(rank(v + d));
        }
        d <<= 1;
    }
    Node { parent, children }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_is_reached_once_in_log_depth() {
        for n in 1..=40 {
            for root in [0, n / 2, n - 1] {
                let nodes: Vec<Node> = (0..n).map(|r| node(r, n, root)).collect();
                assert_eq!(nodes[root].parent, None);
                let mut depth = vec![usize::MAX; n];
                depth[root] = 0;
                // Parents come before children in renumbered order.
                for v in 0..n {
                    let r = (v + root) % n;
                    for &c in &nodes[r].children {
                        assert_eq!(nodes[c].parent, Some(r), "n={n} root={root}");
                        assert_eq!(depth[c], usize::MAX, "reached twice");
                        depth[c] = depth[r] + 1;
                    }
                }
                let max = (n as f64).log2().ceil() as usize;
                assert!(
                    depth.iter().all(|&d| d <= max),
                    "n={n} root={root}: {depth:?}"
                );
            }
        }
    }
}
