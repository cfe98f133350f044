//! The run's deterministic inputs: initial parameters (PyTorch's default
//! for `nn.Linear`, uniform in ±1/√in) and each rank's synthetic regression
//! batches.
//!
//! Targets come from a sparse random teacher: output `j` is
//! `tanh(Σ_t c[j][t] · x[idx[j][t]])` over [`TEACHER_FAN_IN`] inputs, so
//! the data is cheap to make at any width and learnable by the MLP.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::layout::Layout;

/// Inputs each teacher output reads.
pub const TEACHER_FAN_IN: usize = 4;

/// The initial parameters, the same on every rank for one seed.
pub fn init_params(layout: &Layout, seed: u64) -> Vec<f32> {
    let mut p = vec![0.0f32; layout.total()];
    let bound = 1.0 / (layout.width as f32).sqrt();
    // One generator per layer, so the values do not depend on the layout's
    // order.
    for l in 0..layout.layers {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(l as u64));
        for v in &mut p[layout.weight(l)] {
            *v = rng.gen_range(-bound..bound);
        }
        for v in &mut p[layout.bias(l)] {
            *v = rng.gen_range(-bound..bound);
        }
    }
    p
}

/// One rank's batches, each `batch × width` inputs and targets.
#[derive(Clone, Debug)]
pub struct Batches {
    /// Samples per batch.
    pub batch: usize,
    /// Features (= outputs).
    pub width: usize,
    /// Inputs, batch after batch.
    pub x: Vec<f32>,
    /// Targets, batch after batch.
    pub y: Vec<f32>,
}

impl Batches {
    /// `count` batches of `rank` (different on every rank, the same for one
    /// seed); the teacher is the same on every rank.
    pub fn new(seed: u64, rank: usize, count: usize, batch: usize, width: usize) -> Batches {
        let mut teacher = StdRng::seed_from_u64(seed ^ 0x7EAC_4E55);
        let idx: Vec<usize> = (0..width * TEACHER_FAN_IN)
            .map(|_| teacher.gen_range(0..width))
            .collect();
        let coef: Vec<f32> = (0..width * TEACHER_FAN_IN)
            .map(|_| teacher.gen_range(-1.5f32..1.5))
            .collect();
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(0x5EED_0000 + rank as u64));
        let n = count * batch * width;
        let r3 = 3.0f32.sqrt();
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-r3..r3)).collect();
        let mut y = vec![0.0f32; n];
        for (row_x, row_y) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
            for (j, out) in row_y.iter_mut().enumerate() {
                let s: f32 = (0..TEACHER_FAN_IN)
                    .map(|t| coef[j * TEACHER_FAN_IN + t] * row_x[idx[j * TEACHER_FAN_IN + t]])
                    .sum();
                *out = s.tanh();
            }
        }
        Batches { batch, width, x, y }
    }

    /// Number of batches.
    pub fn count(&self) -> usize {
        self.x.len() / (self.batch * self.width).max(1)
    }

    /// Batch `i`'s inputs and targets.
    pub fn get(&self, i: usize) -> (&[f32], &[f32]) {
        let n = self.batch * self.width;
        (&self.x[i * n..(i + 1) * n], &self.y[i * n..(i + 1) * n])
    }
}
