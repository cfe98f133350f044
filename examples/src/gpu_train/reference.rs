//! The CPU reference: the same MLP, loss and update as the GPU trainer, in
//! plain f32 loops (spread over the host's cores), for every rank's batch.
//! The GPU run's first losses must match it within f32 tolerance.

use super::layout::Layout;

/// The reference model: parameters in [`Layout`] order.
#[derive(Clone, Debug)]
pub struct CpuMlp {
    /// Shape.
    pub layout: Layout,
    /// Flat parameters.
    pub params: Vec<f32>,
}

impl CpuMlp {
    /// One data-parallel SGD step on `batches` (one `(x, y)` per rank, each
    /// `batch × width`): every rank's gradient, averaged, then
    /// `p -= lr · g`. Returns the mean over ranks of each rank's loss
    /// (mean squared error over its batch) before the update.
    pub fn step(&mut self, batches: &[(&[f32], &[f32])], lr: f32) -> f64 {
        let world = batches.len().max(1);
        let mut grad = vec![0.0f32; self.layout.total()];
        let mut loss = 0.0f64;
        for (x, y) in batches {
            loss += self.accumulate(x, y, &mut grad);
        }
        let inv = 1.0 / world as f32;
        for (p, g) in self.params.iter_mut().zip(&grad) {
            *p -= lr * (g * inv);
        }
        loss / world as f64
    }

    /// Adds one rank's gradient to `grad`; returns its loss.
    fn accumulate(&self, x: &[f32], y: &[f32], grad: &mut [f32]) -> f64 {
        let (lay, w) = (self.layout, self.layout.width);
        let rows = x.len() / w;
        // Forward, keeping every layer's output.
        let mut acts: Vec<Vec<f32>> = Vec::with_capacity(lay.layers);
        for l in 0..lay.layers {
            let input = if l == 0 { x } else { &acts[l - 1] };
            let mut out = linear(input, &self.params[lay.weight(l)], w);
            let b = &self.params[lay.bias(l)];
            let relu = l + 1 < lay.layers;
            for row in out.chunks_exact_mut(w) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                    if relu && *v <= 0.0 {
                        *v = 0.0;
                    }
                }
            }
            acts.push(out);
        }
        let pred = &acts[lay.layers - 1];
        let n = (rows * w) as f32;
        let mut loss = 0.0f64;
        let mut dy: Vec<f32> = pred
            .iter()
            .zip(y)
            .map(|(p, t)| {
                let e = p - t;
                loss += (e as f64) * (e as f64);
                e * (2.0 / n)
            })
            .collect();
        for l in (0..lay.layers).rev() {
            let input = if l == 0 { x } else { &acts[l - 1] };
            let (bg, wg) = (lay.bias(l), lay.weight(l));
            for row in dy.chunks_exact(w) {
                for (g, d) in grad[bg.clone()].iter_mut().zip(row) {
                    *g += d;
                }
            }
            add_weight_grad(&dy, input, w, &mut grad[wg.clone()]);
            if l > 0 {
                let mut dx = input_grad(&dy, &self.params[wg], w);
                for (d, a) in dx.iter_mut().zip(&acts[l - 1]) {
                    if *a <= 0.0 {
                        *d = 0.0;
                    }
                }
                dy = dx;
            }
        }
        loss / n as f64
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `f(i, row_i)` for every `row`-long row of `out`, rows spread over
/// the host's cores.
fn par_rows(out: &mut [f32], row: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len() / row.max(1);
    let per = rows.div_ceil(threads().min(rows).max(1)).max(1);
    std::thread::scope(|s| {
        for (c, chunk) in out.chunks_mut(per * row).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (i, r) in chunk.chunks_mut(row).enumerate() {
                    f(c * per + i, r);
                }
            });
        }
    });
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yy, xx) in y.iter_mut().zip(x) {
        *yy += alpha * xx;
    }
}

/// `x · wᵀ` (`x` rows × w, `w` w × w as out × in).
fn linear(x: &[f32], weight: &[f32], w: usize) -> Vec<f32> {
    let rows = x.len() / w;
    // Column o of the output for every row at once, then transposed.
    let mut t = vec![0.0f32; w * rows];
    par_rows(&mut t, rows, |o, col| {
        let wo = &weight[o * w..(o + 1) * w];
        for (b, v) in col.iter_mut().enumerate() {
            *v = dot(&x[b * w..(b + 1) * w], wo);
        }
    });
    let mut out = vec![0.0f32; rows * w];
    for o in 0..w {
        for b in 0..rows {
            out[b * w + o] = t[o * rows + b];
        }
    }
    out
}

/// `grad += dyᵀ · x` (w × w).
fn add_weight_grad(dy: &[f32], x: &[f32], w: usize, grad: &mut [f32]) {
    let rows = dy.len() / w;
    par_rows(grad, w, |o, g| {
        for b in 0..rows {
            axpy(dy[b * w + o], &x[b * w..(b + 1) * w], g);
        }
    });
}

/// `dy · w` (rows × w).
fn input_grad(dy: &[f32], weight: &[f32], w: usize) -> Vec<f32> {
    let rows = dy.len() / w;
    let mut dx = vec![0.0f32; rows * w];
    par_rows(&mut dx, w, |b, row| {
        for o in 0..w {
            axpy(dy[b * w + o], &weight[o * w..(o + 1) * w], row);
        }
    });
    dx
}

#[cfg(test)]
mod tests {
    use super::super::data::{init_params, Batches};
    use super::*;

    /// The analytic gradient against a finite difference of the loss.
    #[test]
    fn gradient_matches_a_finite_difference() {
        let layout = Layout {
            layers: 3,
            width: 8,
        };
        let m = CpuMlp {
            layout,
            params: init_params(&layout, 3),
        };
        let data = Batches::new(3, 0, 1, 4, 8);
        let (x, y) = data.get(0);
        let mut g = vec![0.0f32; layout.total()];
        m.accumulate(x, y, &mut g);
        let loss_at = |p: &[f32]| {
            let mm = CpuMlp {
                layout,
                params: p.to_vec(),
            };
            mm.accumulate(x, y, &mut vec![0.0; layout.total()])
        };
        let eps = 1e-2f32;
        for i in [0, 3, 9, 40, 77, layout.total() - 1] {
            let mut p = m.params.clone();
            p[i] += eps;
            let up = loss_at(&p);
            p[i] -= 2.0 * eps;
            let down = loss_at(&p);
            let fd = (up - down) / (2.0 * eps as f64);
            assert!(
                (fd - g[i] as f64).abs() < 2e-3 + 0.05 * fd.abs(),
                "param {i}: finite difference {fd}, gradient {}",
                g[i]
            );
        }
    }

    /// Two ranks averaged equal one rank holding both batches' mean
    /// gradient; and a few steps lower the loss.
    #[test]
    fn steps_lower_the_loss() {
        let layout = Layout {
            layers: 4,
            width: 32,
        };
        let mut m = CpuMlp {
            layout,
            params: init_params(&layout, 1),
        };
        let (a, b) = (Batches::new(1, 0, 1, 16, 32), Batches::new(1, 1, 1, 16, 32));
        let first = m.step(&[a.get(0), b.get(0)], 0.5);
        let mut last = first;
        for _ in 0..200 {
            last = m.step(&[a.get(0), b.get(0)], 0.5);
        }
        assert!(last < 0.5 * first, "{first} -> {last}");
    }
}
