//! Where each parameter lives in the flat parameter (and gradient) vector,
//! and the DDP-style gradient buckets over it.
//!
//! The MLP has `layers` linear layers of `width × width` weights (PyTorch's
//! `out × in` layout) and `width` biases. Parameters are laid out in the
//! order backward produces their gradients, the order PyTorch's DDP fills
//! its buckets in: the last layer first, each layer's bias before its
//! weight (`reversed(model.parameters())`).

use std::ops::Range;

/// The shape of the model and the position of every tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Linear layers.
    pub layers: usize,
    /// Inputs = outputs of every layer.
    pub width: usize,
}

impl Layout {
    /// Parameters of one layer.
    pub fn per_layer(&self) -> usize {
        self.width * self.width + self.width
    }

    /// Every parameter.
    pub fn total(&self) -> usize {
        self.layers * self.per_layer()
    }

    /// Layer `l`'s bias.
    pub fn bias(&self, l: usize) -> Range<usize> {
        let o = (self.layers - 1 - l) * self.per_layer();
        o..o + self.width
    }

    /// Layer `l`'s weight (`width × width`, row-major `out × in`).
    pub fn weight(&self, l: usize) -> Range<usize> {
        let o = self.bias(l).end;
        o..o + self.width * self.width
    }

    /// The tensors in backward order: (layer, range).
    pub fn tensors(&self) -> Vec<(usize, Range<usize>)> {
        (0..self.layers)
            .rev()
            .flat_map(|l| [(l, self.bias(l)), (l, self.weight(l))])
            .collect()
    }
}

/// PyTorch DDP's first bucket cap (`dist._DEFAULT_FIRST_BUCKET_BYTES`).
pub const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// A contiguous run of gradients all_reduced as one op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Its elements in the flat gradient.
    pub range: Range<usize>,
    /// The layer whose backward completes it (its tensors' lowest layer).
    pub last_layer: usize,
}

/// DDP's bucket assignment (`compute_bucket_assignment_by_size`, as after
/// its rebuild in gradient-ready order): tensors in backward order, whole
/// tensors only; a bucket closes once it holds at least its cap, which is
/// `FIRST_BUCKET_BYTES` for the first bucket (or `cap_bytes`, if smaller)
/// and `cap_bytes` for the others.
pub fn buckets(layout: &Layout, cap_bytes: usize, elem_bytes: usize) -> Vec<Bucket> {
    let mut out = Vec::new();
    let mut start = None;
    let mut last_layer = 0;
    let mut bytes = 0;
    for (layer, r) in layout.tensors() {
        let s = *start.get_or_insert(r.start);
        bytes += r.len() * elem_bytes;
        last_layer = layer;
        let cap = if out.is_empty() {
            FIRST_BUCKET_BYTES.min(cap_bytes)
        } else {
            cap_bytes
        };
        if bytes >= cap {
            out.push(Bucket {
                range: s..r.end,
                last_layer,
            });
            start = None;
            bytes = 0;
        }
    }
    if let Some(s) = start {
        out.push(Bucket {
            range: s..layout.total(),
            last_layer,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_tile_the_flat_vector_last_layer_first() {
        let l = Layout {
            layers: 3,
            width: 4,
        };
        let t = l.tensors();
        assert_eq!(t[0], (2, 0..4));
        assert_eq!(t[1], (2, 4..20));
        let mut end = 0;
        for (_, r) in &t {
            assert_eq!(r.start, end);
            end = r.end;
        }
        assert_eq!(end, l.total());
    }

    #[test]
    fn small_model_gets_ddps_two_buckets() {
        // 4 × 1024 f32, 25 MiB cap: {b3, W3} (first bucket, 1 MiB cap),
        // then the other three layers (12 MiB).
        let l = Layout {
            layers: 4,
            width: 1024,
        };
        let b = buckets(&l, 25 << 20, 4);
        assert_eq!(b.len(), 2, "{b:?}");
        assert_eq!(b[0].range, 0..l.per_layer());
        assert_eq!(b[0].last_layer, 3);
        assert_eq!(b[1].range, l.per_layer()..l.total());
        assert_eq!(b[1].last_layer, 0);
    }

    #[test]
    fn large_model_gets_a_bucket_per_layer() {
        let l = Layout {
            layers: 4,
            width: 8192,
        };
        let b = buckets(&l, 25 << 20, 4);
        assert_eq!(b.len(), 4);
        for (k, bk) in b.iter().enumerate() {
            assert_eq!(bk.last_layer, 3 - k);
            assert_eq!(bk.range.len(), l.per_layer());
        }
    }

    #[test]
    fn buckets_cover_everything_once_at_any_cap() {
        let l = Layout {
            layers: 5,
            width: 64,
        };
        for cap in [1, 100, 4096, 20_000, 1 << 30] {
            let b = buckets(&l, cap, 4);
            let mut end = 0;
            for bk in &b {
                assert_eq!(bk.range.start, end);
                end = bk.range.end;
            }
            assert_eq!(end, l.total(), "cap {cap}");
        }
    }
}
