//! The MLP on the GPU: its buffers (allocated once; kernels and GEMMs use
//! their raw addresses) and the launches of forward, backward and the
//! update, all on the compute stream.

use chorus::cuda::CudaSlice;
use chorus::Stream;
use cudarc::driver::DevicePtr;

use super::blas::Blas;
use super::data::Batches;
use super::error::TrainError;
use super::kernels::Kernels;
use super::layout::Layout;
use super::timing::{StepProfile, TimedEvent};

/// A device buffer and its address.
struct Buf<T> {
    _slice: CudaSlice<T>,
    ptr: u64,
}

fn buf<T: chorus::cuda::DeviceRepr + chorus::cuda::ValidAsZeroBits>(
    s: &Stream,
    rank: usize,
    host: Option<&[T]>,
    len: usize,
) -> Result<Buf<T>, TrainError> {
    let cuda = |source| TrainError::Cuda { rank, source };
    let slice = match host {
        Some(h) => s.clone_htod(h).map_err(cuda)?,
        None => s.alloc_zeros::<T>(len.max(1)).map_err(cuda)?,
    };
    let ptr = {
        let (p, _guard) = slice.device_ptr(s.cudarc());
        p
    };
    Ok(Buf { _slice: slice, ptr })
}

/// The model, its gradients, activations and data on one GPU.
pub struct GpuMlp {
    /// Shape.
    pub layout: Layout,
    /// Samples per batch.
    pub batch: usize,
    rank: usize,
    /// The compute stream.
    pub stream: Stream,
    blas: Blas,
    kernels: Kernels,
    params: Buf<f32>,
    grads: Buf<f32>,
    acts: Vec<Buf<f32>>,
    d: [Buf<f32>; 2],
    x: Buf<f32>,
    y: Buf<f32>,
    /// Per step: the sum of squared errors (f32).
    losses: Buf<f32>,
    /// Per step: the parameters' hash after the update (u64).
    hashes: Buf<u64>,
    steps: usize,
}

impl std::fmt::Debug for GpuMlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMlp")
            .field("layout", &self.layout)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

/// Launches one kernel or GEMM, between two timing events when profiling.
fn traced(
    prof: &mut Option<&mut StepProfile>,
    stream: &Stream,
    rank: usize,
    label: impl FnOnce() -> String,
    f: impl FnOnce() -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    match prof {
        None => f(),
        Some(p) => {
            let (a, b) = (TimedEvent::new(rank)?, TimedEvent::new(rank)?);
            a.record(stream, rank)?;
            f()?;
            b.record(stream, rank)?;
            p.kernels.push((label(), a, b));
            Ok(())
        }
    }
}

impl GpuMlp {
    /// Uploads the parameters and this rank's batches; allocates the rest.
    ///
    /// # Errors
    ///
    /// CUDA, cuBLAS or kernel-loading errors, each naming its call.
    pub fn new(
        stream: Stream,
        rank: usize,
        layout: Layout,
        params: &[f32],
        data: &Batches,
        steps: usize,
    ) -> Result<GpuMlp, TrainError> {
        let blas = Blas::new(&stream, rank)?;
        let kernels = Kernels::load(stream.device(), rank)?;
        let act = data.batch * layout.width;
        let s = &stream;
        Ok(GpuMlp {
            params: buf(s, rank, Some(params), 0)?,
            grads: buf(s, rank, None, layout.total())?,
            acts: (0..layout.layers)
                .map(|_| buf(s, rank, None, act))
                .collect::<Result<_, _>>()?,
            d: [buf(s, rank, None, act)?, buf(s, rank, None, act)?],
            x: buf(s, rank, Some(&data.x), 0)?,
            y: buf(s, rank, Some(&data.y), 0)?,
            losses: buf(s, rank, None, steps)?,
            hashes: buf(s, rank, None, steps)?,
            layout,
            batch: data.batch,
            rank,
            steps,
            blas,
            kernels,
            stream,
        })
    }

    /// Address of the flat parameter vector.
    pub fn params_ptr(&self) -> u64 {
        self.params.ptr
    }

    /// Address of element `i` of the flat gradient.
    pub fn grad_ptr(&self, i: usize) -> u64 {
        self.grads.ptr + 4 * i as u64
    }

    /// Forward on batch `b` and the loss's gradient, for step `step`.
    ///
    /// # Errors
    ///
    /// A launch's error, naming it.
    pub fn forward(
        &mut self,
        step: usize,
        b: usize,
        prof: &mut Option<&mut StepProfile>,
    ) -> Result<(), TrainError> {
        let (lay, rows, rank) = (self.layout, self.batch, self.rank);
        let w = lay.width;
        let n = rows * w;
        let xb = self.x.ptr + 4 * (b * n) as u64;
        let yb = self.y.ptr + 4 * (b * n) as u64;
        for l in 0..lay.layers {
            let input = if l == 0 { xb } else { self.acts[l - 1].ptr };
            let out = self.acts[l].ptr;
            let wp = self.params.ptr + 4 * lay.weight(l).start as u64;
            let bp = self.params.ptr + 4 * lay.bias(l).start as u64;
            let blas = &mut self.blas;
            traced(
                prof,
                &self.stream,
                rank,
                || format!("fwd gemm {l}"),
                || blas.linear_forward(l, (rows, w, w), input, wp, out),
            )?;
            let k = &self.kernels;
            let relu = l + 1 < lay.layers;
            traced(
                prof,
                &self.stream,
                rank,
                || format!("fwd bias+act {l}"),
                || k.bias_act(&self.stream, out, bp, n, w, relu),
            )?;
        }
        let pred = self.acts[lay.layers - 1].ptr;
        let loss = self.losses.ptr + 4 * step as u64;
        let (k, d0) = (&self.kernels, self.d[0].ptr);
        traced(
            prof,
            &self.stream,
            rank,
            || "mse loss".into(),
            || k.mse(&self.stream, pred, yb, d0, n, 2.0 / n as f32, loss),
        )
    }

    /// Backward on batch `b`, last layer first; `grads_done(l)` is called
    /// once layer `l`'s parameter gradients are issued.
    ///
    /// # Errors
    ///
    /// A launch's error, or `grads_done`'s.
    pub fn backward(
        &mut self,
        b: usize,
        prof: &mut Option<&mut StepProfile>,
        mut grads_done: impl FnMut(usize, &mut Option<&mut StepProfile>) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        let (lay, rows, rank) = (self.layout, self.batch, self.rank);
        let w = lay.width;
        let n = rows * w;
        let xb = self.x.ptr + 4 * (b * n) as u64;
        let mut cur = 0;
        for l in (0..lay.layers).rev() {
            let dy = self.d[cur].ptr;
            let input = if l == 0 { xb } else { self.acts[l - 1].ptr };
            let gb = self.grads.ptr + 4 * lay.bias(l).start as u64;
            let gw = self.grads.ptr + 4 * lay.weight(l).start as u64;
            let wp = self.params.ptr + 4 * lay.weight(l).start as u64;
            let k = &self.kernels;
            traced(
                prof,
                &self.stream,
                rank,
                || format!("bwd bias grad {l}"),
                || k.col_sum(&self.stream, dy, gb, rows, w),
            )?;
            let blas = &mut self.blas;
            traced(
                prof,
                &self.stream,
                rank,
                || format!("bwd weight grad {l}"),
                || blas.linear_weight_grad(l, (rows, w, w), dy, input, gw),
            )?;
            grads_done(l, prof)?;
            if l > 0 {
                let dx = self.d[1 - cur].ptr;
                traced(
                    prof,
                    &self.stream,
                    rank,
                    || format!("bwd input grad {l}"),
                    || blas.linear_input_grad(l, (rows, w, w), dy, wp, dx),
                )?;
                let a = self.acts[l - 1].ptr;
                traced(
                    prof,
                    &self.stream,
                    rank,
                    || format!("bwd relu {l}"),
                    || k.relu_bwd(&self.stream, dx, a, n),
                )?;
                cur = 1 - cur;
            }
        }
        Ok(())
    }

    /// `p -= lr · g` over the flat range `r`.
    ///
    /// # Errors
    ///
    /// The launch's error.
    pub fn sgd(
        &self,
        r: std::ops::Range<usize>,
        lr: f32,
        prof: &mut Option<&mut StepProfile>,
    ) -> Result<(), TrainError> {
        let p = self.params.ptr + 4 * r.start as u64;
        let g = self.grads.ptr + 4 * r.start as u64;
        traced(
            prof,
            &self.stream,
            self.rank,
            || format!("sgd [{}, {})", r.start, r.end),
            || self.kernels.sgd(&self.stream, p, g, r.len(), lr),
        )
    }

    /// Hashes the parameters into step `step`'s slot.
    ///
    /// # Errors
    ///
    /// The launch's error.
    pub fn hash(&self, step: usize, prof: &mut Option<&mut StepProfile>) -> Result<(), TrainError> {
        let out = self.hashes.ptr + 8 * step as u64;
        traced(
            prof,
            &self.stream,
            self.rank,
            || "param hash".into(),
            || {
                self.kernels
                    .hash(&self.stream, self.params.ptr, self.layout.total(), out)
            },
        )
    }

    /// Waits for the stream and copies back steps `from..to`'s losses (as
    /// mean squared errors) and parameter hashes.
    ///
    /// # Errors
    ///
    /// CUDA errors of the copies or of any earlier work.
    pub fn read_back(&self, from: usize, to: usize) -> Result<(Vec<f64>, Vec<u64>), TrainError> {
        let cuda = |source| TrainError::Cuda {
            rank: self.rank,
            source,
        };
        let to = to.min(self.steps);
        let losses = self.stream.clone_dtoh(&self.losses._slice).map_err(cuda)?;
        let hashes = self.stream.clone_dtoh(&self.hashes._slice).map_err(cuda)?;
        let n = (self.batch * self.layout.width) as f64;
        Ok((
            losses[from..to].iter().map(|&v| v as f64 / n).collect(),
            hashes[from..to].to_vec(),
        ))
    }
}
