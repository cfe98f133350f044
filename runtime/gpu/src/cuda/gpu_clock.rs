//! [`GpuClock`]: the GPU's nanosecond clock (`%globaltimer`) on the host's
//! time line, for measuring when GPU work ended against when a host
//! thread learned of it.

use std::time::{Duration, Instant};

use super::error::CudaError;
use super::host_mapped::HostSlots;
use super::kernels::Kernels;
use super::stream::Stream;

/// Maps GPU timestamps to host time.
///
/// Calibrated by handshakes: a kernel spins on a host-mapped flag; the host
/// notes its clock and sets the flag; the kernel stamps the GPU's clock as
/// soon as it sees it. The stamp comes at least one PCIe write after the
/// host's instant, so the offset kept (the smallest of all handshakes) errs
/// towards GPU times that map a little *earlier* than they were: a delay
/// measured from a mapped GPU time is never shorter than the true one, by
/// about a microsecond.
///
/// The offset holds near the calibration: the GPU's clock runs at its own
/// rate, not quite the host's, so a GPU span of many milliseconds, or a
/// time long after the calibration, is off by that rate's difference
/// (`wake_probe` measures it from its handshakes and converts).
#[derive(Debug, Clone, Copy)]
pub struct GpuClock {
    base: Instant,
    /// GPU clock minus host clock (ns since `base`), smallest seen.
    offset_ns: i128,
    /// Spread of the handshakes' offsets (largest minus smallest), ns.
    spread_ns: i128,
}

impl GpuClock {
    /// Calibrates with `rounds` handshakes on `stream` (which must be idle:
    /// each handshake's kernel has to be running when the host sets the
    /// flag).
    ///
    /// # Errors
    ///
    /// Launch or allocation errors of the kernels and slots.
    pub fn calibrate(k: &Kernels, stream: &Stream, rounds: usize) -> Result<GpuClock, CudaError> {
        let slots = HostSlots::new(stream.device(), 2)?;
        let base = Instant::now();
        let (mut lo, mut hi) = (i128::MAX, i128::MIN);
        for _ in 0..rounds.max(1) {
            slots.set(0, 0);
            slots.set(1, 0);
            k.wait_flag(stream, &slots, 0, 1)?;
            // Let the kernel start spinning.
            std::thread::sleep(Duration::from_micros(200));
            let host = base.elapsed().as_nanos() as i128;
            slots.set(0, 1);
            let t = Instant::now();
            while slots.get(1) == 0 && t.elapsed() < Duration::from_secs(1) {
                std::hint::spin_loop();
            }
            let gpu = slots.get(1) as i128;
            if gpu == 0 {
                continue;
            }
            lo = lo.min(gpu - host);
            hi = hi.max(gpu - host);
        }
        stream.synchronize()?;
        if lo == i128::MAX {
            return Err(CudaError::Unavailable {
                reason: "the GPU clock handshake never completed".into(),
            });
        }
        Ok(GpuClock {
            base,
            offset_ns: lo,
            spread_ns: hi - lo,
        })
    }

    /// Host time now, in ns on this clock's time line.
    pub fn now_ns(&self) -> i128 {
        self.base.elapsed().as_nanos() as i128
    }

    /// Host time of `instant`, in ns on this clock's time line.
    pub fn host_ns(&self, instant: Instant) -> i128 {
        instant.saturating_duration_since(self.base).as_nanos() as i128
    }

    /// Host time (ns on this time line) of a GPU timestamp.
    pub fn from_gpu(&self, gpu_ns: u64) -> i128 {
        gpu_ns as i128 - self.offset_ns
    }

    /// How far apart the calibration's handshakes landed (ns): a bound on
    /// its jitter.
    pub fn spread_ns(&self) -> i128 {
        self.spread_ns
    }
}
