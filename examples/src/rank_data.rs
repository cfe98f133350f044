//! Test data every rank can compute for any rank.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Deterministic random data of `rank` for case `case` (small integers as
/// f32, so every reduction order gives the same result and any rank can
/// compute the reference).
pub fn rank_data(case: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(case * 7919 + rank as u64);
    (0..len)
        .map(|_| rng.gen_range(-64i32..=64) as f32)
        .collect()
}
