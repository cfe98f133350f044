//! Loading [`ptx::PTX`](super::ptx::PTX) and launching its kernels on a
//! stream, by raw device address (the trainer's buffers live for the
//! whole run).

use std::ffi::{c_void, CString};

use cudarc::driver::{result, sys};

use super::error::TrainError;
use super::ptx::{BLOCK, KERNEL_NAMES, MAX_REDUCE_BLOCKS, PTX};
use chorus::{Device, Stream};

/// The trainer's kernels, loaded on one device.
pub struct Kernels {
    device: Device,
    rank: usize,
    module: sys::CUmodule,
    funcs: [sys::CUfunction; 6],
}

// SAFETY: module and function handles are plain driver handles, usable
// from any thread once the context is bound.
unsafe impl Send for Kernels {}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}

/// A kernel parameter, passed to `cuLaunchKernel` by address.
enum Arg {
    Ptr(u64),
    U32(u32),
    F32(f32),
}

impl Kernels {
    /// JIT-loads the module on `device` (`cuModuleLoadData`).
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming `cuModuleLoadData` (the driver
    /// refused the PTX) or `cuModuleGetFunction`.
    pub fn load(device: &Device, rank: usize) -> Result<Kernels, TrainError> {
        device
            .bind_to_thread()
            .map_err(|source| TrainError::Cuda { rank, source })?;
        let src = CString::new(PTX).map_err(|_| TrainError::Config("PTX holds a NUL".into()))?;
        // SAFETY: `src` is a NUL-terminated PTX image alive for the call;
        // the device's context is current.
        let module = unsafe { result::module::load_data(src.as_ptr() as *const c_void) }
            .map_err(|e| TrainError::driver(rank, "cuModuleLoadData", "the trainer's PTX", e))?;
        let mut funcs = [std::ptr::null_mut(); 6];
        for (f, name) in funcs.iter_mut().zip(KERNEL_NAMES) {
            let n = CString::new(name).map_err(|_| TrainError::Config(name.into()))?;
            // SAFETY: `module` was just loaded and lives as long as `self`.
            *f = unsafe { result::module::get_function(module, n) }
                .map_err(|e| TrainError::driver(rank, "cuModuleGetFunction", name, e))?;
        }
        Ok(Kernels {
            device: device.clone(),
            rank,
            module,
            funcs,
        })
    }

    fn launch(
        &self,
        k: usize,
        blocks: u32,
        stream: &Stream,
        args: &[Arg],
    ) -> Result<(), TrainError> {
        let mut vals: Vec<[u8; 8]> = args
            .iter()
            .map(|a| {
                let mut v = [0u8; 8];
                match a {
                    Arg::Ptr(p) => v.copy_from_slice(&p.to_ne_bytes()),
                    Arg::U32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                    Arg::F32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                }
                v
            })
            .collect();
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: each kernel's parameter list is (u64 | u32 | f32)* as
        // `args` gives it (the wrappers below match PTX's signatures); each
        // value is read by the driver from its own 8-byte cell, alive for
        // the call, at its type's size; the addresses are device buffers of
        // the sizes the wrappers check; the stream is on this device.
        unsafe {
            result::launch_kernel(
                self.funcs[k],
                (blocks.max(1), 1, 1),
                (BLOCK, 1, 1),
                0,
                stream.as_raw(),
                &mut params,
            )
        }
        .map_err(|e| TrainError::driver(self.rank, "cuLaunchKernel", KERNEL_NAMES[k], e))
    }

    fn n32(&self, what: &'static str, n: usize) -> Result<u32, TrainError> {
        u32::try_from(n)
            .ok()
            .filter(|&v| v < u32::MAX - 2 * BLOCK * MAX_REDUCE_BLOCKS)
            .ok_or_else(|| {
                TrainError::Config(format!(
                    "{what}: {n} elements is more than one launch indexes"
                ))
            })
    }

    fn blocks(n: u32) -> u32 {
        n.div_ceil(BLOCK)
    }

    fn reduce_blocks(n: u32) -> u32 {
        n.div_ceil(BLOCK).clamp(1, MAX_REDUCE_BLOCKS)
    }

    /// `y[i] += bias[i % width]`, then ReLU if `relu`.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming the launch.
    pub fn bias_act(
        &self,
        s: &Stream,
        y: u64,
        bias: u64,
        n: usize,
        width: usize,
        relu: bool,
    ) -> Result<(), TrainError> {
        let n = self.n32("bias_act", n)?;
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(bias),
            Arg::U32(n),
            Arg::U32(width as u32),
            Arg::U32(relu as u32),
        ];
        self.launch(0, Self::blocks(n), s, &args)
    }

    /// `d[i] = a[i] > 0 ? d[i] : 0`.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming the launch.
    pub fn relu_bwd(&self, s: &Stream, d: u64, a: u64, n: usize) -> Result<(), TrainError> {
        let n = self.n32("relu_bwd", n)?;
        self.launch(
            1,
            Self::blocks(n),
            s,
            &[Arg::Ptr(d), Arg::Ptr(a), Arg::U32(n)],
        )
    }

    /// `out[o] = Σ_b d[b·width + o]`.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming the launch.
    pub fn col_sum(
        &self,
        s: &Stream,
        d: u64,
        out: u64,
        rows: usize,
        width: usize,
    ) -> Result<(), TrainError> {
        let w = self.n32("col_sum", width)?;
        let r = self.n32("col_sum", rows)?;
        let args = [Arg::Ptr(d), Arg::Ptr(out), Arg::U32(r), Arg::U32(w)];
        self.launch(2, Self::blocks(w), s, &args)
    }

    /// `d = scale · (pred - y)` and `*loss += Σ (pred - y)²`.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming the launch.
    #[allow(clippy::too_many_arguments)]
    pub fn mse(
        &self,
        s: &Stream,
        pred: u64,
        y: u64,
        d: u64,
        n: usize,
        scale: f32,
        loss: u64,
    ) -> Result<(), TrainError> {
        let n = self.n32("mse", n)?;
        let args = [
            Arg::Ptr(pred),
            Arg::Ptr(y),
            Arg::Ptr(d),
            Arg::U32(n),
            Arg::F32(scale),
            Arg::Ptr(loss),
        ];
        self.launch(3, Self::reduce_blocks(n), s, &args)
    }

    /// `p -= lr · g` over `n` elements.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming the launch.
    pub fn sgd(&self, s: &Stream, p: u64, g: u64, n: usize, lr: f32) -> Result<(), TrainError> {
        let n = self.n32("sgd", n)?;
        self.launch(
            4,
            Self::blocks(n),
            s,
            &[Arg::Ptr(p), Arg::Ptr(g), Arg::U32(n), Arg::F32(lr)],
        )
    }

    /// `*out ^= hash(p[0..n])` (`out` must start at 0).
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming the launch.
    pub fn hash(&self, s: &Stream, p: u64, n: usize, out: u64) -> Result<(), TrainError> {
        let n = self.n32("hash", n)?;
        self.launch(
            5,
            Self::reduce_blocks(n),
            s,
            &[Arg::Ptr(p), Arg::U32(n), Arg::Ptr(out)],
        )
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if self.device.bind_to_thread().is_ok() {
            // SAFETY: loaded by `load`, unloaded once; the trainer
            // synchronizes the device before dropping its kernels.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}
