//! Tiny kernels shipped as PTX text and loaded with `cuModuleLoadData`,
//! for GPU tests and benchmarks (no nvcc or NVRTC needed):
//!
//! * [`Kernels::spin`]: keeps a stream busy for an exact time by spinning on
//!   `%globaltimer` (a GPU "sleep").
//! * [`Kernels::add_one`]: `dst[i] = src[i] + 1.0` on `f32` (a consumer that
//!   reads what an op wrote).
//! * [`Kernels::stamp`]: stores `%globaltimer` (the GPU's nanosecond clock)
//!   to an address, e.g. a [`HostSlots`] slot: when the
//!   work before it on the stream ended, on the GPU's clock.
//! * [`Kernels::wait_flag`]: spins until a host-written flag is non-zero,
//!   then stamps: relates the GPU's clock to the host's
//!   ([`GpuClock`](super::GpuClock)).
//! * [`Kernels::trap`]: faults (`trap`): a CUDA error that leaves the
//!   context unusable, for tests of how errors reach waiters (run it in a
//!   process of its own).

use std::ffi::{c_void, CString};
use std::time::Duration;

use cudarc::driver::{result, sys, CudaSlice, DevicePtr, DevicePtrMut};

use super::device::Device;
use super::error::{driver_error, CudaError};
use super::host_mapped::HostSlots;
use super::stream::Stream;

const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry chorus_spin(.param .u64 ns)
{
    .reg .u64 %rd<5>;
    .reg .pred %p;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
SPIN:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra SPIN;
    ret;
}

.visible .entry chorus_stamp(.param .u64 dst)
{
    .reg .u64 %rd<3>;
    ld.param.u64 %rd1, [dst];
    mov.u64 %rd2, %globaltimer;
    st.volatile.global.u64 [%rd1], %rd2;
    membar.sys;
    ret;
}

.visible .entry chorus_wait_flag(.param .u64 flag, .param .u64 dst)
{
    .reg .u64 %rd<5>;
    .reg .pred %p;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [dst];
WAIT:
    ld.volatile.global.u64 %rd3, [%rd1];
    setp.eq.u64 %p, %rd3, 0;
    @%p bra WAIT;
    mov.u64 %rd4, %globaltimer;
    st.volatile.global.u64 [%rd2], %rd4;
    membar.sys;
    ret;
}

.visible .entry chorus_trap()
{
    trap;
}

.visible .entry chorus_add_one(.param .u64 src, .param .u64 dst, .param .u32 n)
{
    .reg .u32 %r<6>;
    .reg .u64 %rd<8>;
    .reg .f32 %f<3>;
    .reg .pred %p;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f1, [%rd6];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd7], %f2;
DONE:
    ret;
}
"#;

/// The loaded kernels of one device.
pub struct Kernels {
    device: Device,
    module: sys::CUmodule,
    spin: sys::CUfunction,
    add_one: sys::CUfunction,
    stamp: sys::CUfunction,
    wait_flag: sys::CUfunction,
    trap: sys::CUfunction,
}

// SAFETY: module and function handles are plain driver handles, usable from
// any thread once the context is bound.
unsafe impl Send for Kernels {}
// SAFETY: as above; launches do not mutate the handles.
unsafe impl Sync for Kernels {}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl Kernels {
    /// Loads the PTX on `device` (JIT-compiled by the driver).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the driver refuses the module.
    pub fn load(device: &Device) -> Result<Kernels, CudaError> {
        device.bind_to_thread()?;
        let src = CString::new(PTX).map_err(|_| CudaError::Unavailable {
            reason: "PTX text contains a NUL byte".into(),
        })?;
        // SAFETY: `src` is a NUL-terminated PTX image that outlives the call;
        // the device's context is current.
        let module = unsafe { result::module::load_data(src.as_ptr() as *const c_void) }
            .map_err(|e| driver_error("cuModuleLoadData", e))?;
        let get = |name: &str| {
            let n = CString::new(name).unwrap_or_default();
            // SAFETY: `module` was just loaded and is not unloaded before
            // `Kernels` is dropped.
            unsafe { result::module::get_function(module, n) }
                .map_err(|e| driver_error("cuModuleGetFunction", e))
        };
        let spin = get("chorus_spin")?;
        let add_one = get("chorus_add_one")?;
        let stamp = get("chorus_stamp")?;
        let wait_flag = get("chorus_wait_flag")?;
        let trap = get("chorus_trap")?;
        Ok(Kernels {
            device: device.clone(),
            module,
            spin,
            add_one,
            stamp,
            wait_flag,
            trap,
        })
    }

    /// Enqueues a kernel on `stream` that spins for `d` (GPU time).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the launch fails.
    pub fn spin(&self, stream: &Stream, d: Duration) -> Result<(), CudaError> {
        self.device.bind_to_thread()?;
        let mut ns: u64 = d.as_nanos().min(u64::MAX as u128) as u64;
        let mut params = [&mut ns as *mut u64 as *mut c_void];
        // SAFETY: the kernel takes one u64 parameter, passed by pointer to a
        // live local; the stream belongs to this device.
        unsafe {
            result::launch_kernel(
                self.spin,
                (1, 1, 1),
                (1, 1, 1),
                0,
                stream.as_raw(),
                &mut params,
            )
        }
        .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    /// Enqueues a kernel on `stream` that stores the GPU's clock
    /// (`%globaltimer`, ns) to slot `i` of `slots` once the work before it
    /// has ended.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the launch fails.
    pub fn stamp(&self, stream: &Stream, slots: &HostSlots, i: usize) -> Result<(), CudaError> {
        self.launch_u64s(self.stamp, stream, &mut [slots.device_ptr(i)])
    }

    /// Enqueues a kernel on `stream` that spins until slot `flag` of
    /// `slots` is non-zero, then stores the GPU's clock to slot `dst`.
    /// Set the flag with [`HostSlots::set`] (dropping the slots sets it
    /// too), or the stream does not move on.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the launch fails.
    pub fn wait_flag(
        &self,
        stream: &Stream,
        slots: &HostSlots,
        flag: usize,
        dst: usize,
    ) -> Result<(), CudaError> {
        let args = [slots.device_ptr(flag), slots.device_ptr(dst)];
        self.launch_u64s(self.wait_flag, stream, &mut { args })
    }

    /// Enqueues a kernel on `stream` that faults when it runs: every later
    /// driver call of the process's context fails (a sticky error). For a
    /// test in a process of its own.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the launch fails.
    pub fn trap(&self, stream: &Stream) -> Result<(), CudaError> {
        self.launch_u64s(self.trap, stream, &mut [])
    }

    /// Launches `f` as one thread with u64 parameters `args`.
    fn launch_u64s(
        &self,
        f: sys::CUfunction,
        stream: &Stream,
        args: &mut [u64],
    ) -> Result<(), CudaError> {
        self.device.bind_to_thread()?;
        let mut params: Vec<*mut c_void> = args
            .iter_mut()
            .map(|a| a as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: the kernels launched here take exactly these u64
        // parameters, passed by pointer to live values; the addresses are
        // host slots that stay allocated until every kernel of the device
        // has run (`HostSlots`'s drop synchronizes the device first).
        unsafe { result::launch_kernel(f, (1, 1, 1), (1, 1, 1), 0, stream.as_raw(), &mut params) }
            .map_err(|e| driver_error("cuLaunchKernel", e))
    }

    /// Enqueues `dst[i] = src[i] + 1.0` on `stream`.
    ///
    /// # Errors
    ///
    /// [`CudaError::LengthMismatch`] if the lengths differ,
    /// [`CudaError::Driver`] if the launch fails.
    pub fn add_one(
        &self,
        stream: &Stream,
        src: &CudaSlice<f32>,
        dst: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        if src.len() != dst.len() || src.len() > u32::MAX as usize {
            return Err(CudaError::LengthMismatch {
                what: "add_one",
                expected: src.len(),
                found: dst.len(),
            });
        }
        self.device.bind_to_thread()?;
        let s = stream.cudarc();
        let (mut sp, _g1) = src.device_ptr(s);
        let (mut dp, _g2) = dst.device_ptr_mut(s);
        let mut n = src.len() as u32;
        let mut params = [
            &mut sp as *mut u64 as *mut c_void,
            &mut dp as *mut u64 as *mut c_void,
            &mut n as *mut u32 as *mut c_void,
        ];
        let blocks = n.div_ceil(256).max(1);
        // SAFETY: parameters match the kernel's (u64, u64, u32), passed by
        // pointer to live locals; both buffers hold `n` f32 on this device
        // and the guards order them on `stream`.
        unsafe {
            result::launch_kernel(
                self.add_one,
                (blocks, 1, 1),
                (256, 1, 1),
                0,
                s.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| driver_error("cuLaunchKernel", e))
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if self.device.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `load` and is unloaded once.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}
