//! A cuBLAS handle on the compute stream, and the three GEMMs of a linear
//! layer on row-major matrices.
//!
//! cuBLAS is column-major; a row-major `R × C` matrix is the column-major
//! `C × R` matrix of its transpose, so each row-major product below is
//! issued as the transposed column-major one.

use cudarc::cublas::{result, sys};

use super::blas_search::cublas;
use super::error::TrainError;
use chorus::Stream;

/// A cuBLAS handle bound to one stream.
#[derive(Debug)]
pub struct Blas {
    handle: sys::cublasHandle_t,
    rank: usize,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as calls on
// it do not overlap; `Blas` is only used through `&mut self` or by one
// thread at a time.
unsafe impl Send for Blas {}

impl Blas {
    /// Finds cuBLAS, creates a handle and binds it to `stream` (the
    /// stream's context must be current on this thread).
    ///
    /// # Errors
    ///
    /// [`TrainError::BlasMissing`] when no cuBLAS is found (with every place
    /// searched), [`TrainError::Blas`] naming the failed call.
    pub fn new(stream: &Stream, rank: usize) -> Result<Blas, TrainError> {
        let lib = cublas().map_err(|e| TrainError::BlasMissing {
            reason: e.reason.clone(),
            searched: e.searched.join(", "),
        })?;
        tracing::debug!(rank, found = %lib.found, "cuBLAS");
        stream
            .device()
            .bind_to_thread()
            .map_err(|source| TrainError::Cuda { rank, source })?;
        let fail = |call, e: result::CublasError| TrainError::Blas {
            rank,
            call,
            what: "setup".into(),
            status: format!("{:?}", e.0),
        };
        let handle = result::create_handle().map_err(|e| fail("cublasCreate_v2", e))?;
        let blas = Blas { handle, rank };
        // SAFETY: the handle was just created; the stream outlives the
        // handle's use (the trainer drops `Blas` before its streams).
        unsafe { result::set_stream(handle, stream.as_raw() as sys::cudaStream_t) }
            .map_err(|e| fail("cublasSetStream_v2", e))?;
        Ok(blas)
    }

    /// `C = A · B` for row-major `A` (`m × k`) and `B` (`k × n`), `C` is
    /// `m × n`; `accumulate` adds to `C` instead.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        what: &dyn Fn() -> String,
        trans_a: bool,
        trans_b: bool,
        (m, n, k): (usize, usize, usize),
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        c: u64,
        ldc: usize,
    ) -> Result<(), TrainError> {
        let op = |t| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let dims = [m, n, k, lda, ldb, ldc];
        if dims.iter().any(|&d| d > i32::MAX as usize) {
            return Err(TrainError::Blas {
                rank: self.rank,
                call: "cublasSgemm_v2",
                what: what(),
                status: format!("dimensions {dims:?} exceed cuBLAS's 32-bit sizes"),
            });
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: swap the operands.
        // SAFETY: the pointers are device allocations of the sizes the
        // caller's layer shapes give (checked when the model was built);
        // alpha and beta are host values alive for the call (host pointer
        // mode, the default).
        unsafe {
            result::sgemm(
                self.handle,
                op(trans_b),
                op(trans_a),
                n as i32,
                m as i32,
                k as i32,
                &alpha,
                b as *const f32,
                ldb as i32,
                a as *const f32,
                lda as i32,
                &beta,
                c as *mut f32,
                ldc as i32,
            )
        }
        .map_err(|e| TrainError::Blas {
            rank: self.rank,
            call: "cublasSgemm_v2",
            what: what(),
            status: format!("{:?}", e.0),
        })
    }

    /// Forward of a linear layer: `y = x · wᵀ` with `x` `rows × inp`, `w`
    /// `out × inp` (PyTorch's layout), `y` `rows × out`.
    ///
    /// # Errors
    ///
    /// [`TrainError::Blas`] naming the layer.
    pub fn linear_forward(
        &mut self,
        layer: usize,
        (rows, inp, out): (usize, usize, usize),
        x: u64,
        w: u64,
        y: u64,
    ) -> Result<(), TrainError> {
        let what = || format!("layer {layer} forward");
        self.gemm(&what, false, true, (rows, out, inp), x, inp, w, inp, y, out)
    }

    /// Input gradient: `dx = dy · w` (`dy` `rows × out`, `w` `out × inp`).
    ///
    /// # Errors
    ///
    /// [`TrainError::Blas`] naming the layer.
    pub fn linear_input_grad(
        &mut self,
        layer: usize,
        (rows, inp, out): (usize, usize, usize),
        dy: u64,
        w: u64,
        dx: u64,
    ) -> Result<(), TrainError> {
        let what = || format!("layer {layer} input gradient");
        self.gemm(
            &what,
            false,
            false,
            (rows, inp, out),
            dy,
            out,
            w,
            inp,
            dx,
            inp,
        )
    }

    /// Weight gradient: `dw = dyᵀ · x` (`out × inp`).
    ///
    /// # Errors
    ///
    /// [`TrainError::Blas`] naming the layer.
    pub fn linear_weight_grad(
        &mut self,
        layer: usize,
        (rows, inp, out): (usize, usize, usize),
        dy: u64,
        x: u64,
        dw: u64,
    ) -> Result<(), TrainError> {
        let what = || format!("layer {layer} weight gradient");
        self.gemm(
            &what,
            true,
            false,
            (out, inp, rows),
            dy,
            out,
            x,
            inp,
            dw,
            inp,
        )
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}
