//! Where the host time of an NCCL enqueue goes, phase by phase, for
//! benchmarks.
//!
//! Built only with the `profile` feature; without it every function here
//! is an empty inline stub and the enqueue path carries no trace of it.
//! With it, profiling is still off until [`set_enabled`] turns it on (chorus
//! does so for `CHORUS_NCCL_PROFILE=1`); off, each stamp is one load of a
//! flag. The enqueue path stamps the end of each phase of an op;
//! [`medians`] gives each phase's median over the ops profiled.

/// A phase of the NCCL enqueue path; a stamp marks its end. The phases
/// come in this order, each starting where the one before it ended (the
/// first where [`start`] was called).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Finding the group's communicator.
    CommLookup,
    /// Taking the op's end event from the communicator's pool.
    EndEvent,
    /// The op's sequence number and context (and the checked mode's
    /// signature check).
    Sequence,
    /// Reading the clock.
    Clock,
    /// The work: its registry entry, flight record and shared state.
    Work,
    /// Submitting: checks, the communicator's enqueue lock.
    SubmitLock,
    /// Submitting: the input-ready record and wait, the NCCL call, the end
    /// record.
    SubmitLaunch,
    /// Submitting: the in-flight op.
    SubmitInflight,
    /// The work handle returned to the caller.
    Handle,
}

/// The number of phases.
const N: usize = Phase::ALL.len();

impl Phase {
    /// Every phase, in the order the enqueue path goes through them (the
    /// order of [`medians`]).
    pub const ALL: [Phase; 9] = [
        Phase::CommLookup,
        Phase::EndEvent,
        Phase::Sequence,
        Phase::Clock,
        Phase::Work,
        Phase::SubmitLock,
        Phase::SubmitLaunch,
        Phase::SubmitInflight,
        Phase::Handle,
    ];

    /// What the phase does, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::CommLookup => "communicator lookup",
            Phase::EndEvent => "end event from the pool",
            Phase::Sequence => "sequence number, op context",
            Phase::Clock => "clock reading",
            Phase::Work => "work: registry entry, flight record, shared state",
            Phase::SubmitLock => "submit: checks, lock",
            Phase::SubmitLaunch => "submit: input-ready record + wait, NCCL call, end record",
            Phase::SubmitInflight => "submit: in-flight op",
            Phase::Handle => "work handle",
        }
    }
}

#[cfg(feature = "profile")]
mod imp {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;

    use super::{Phase, N};

    /// At most this many ops are kept.
    const MAX_SAMPLES: usize = 1 << 21;

    thread_local! {
        static STAMPS: Cell<[Option<Instant>; N + 1]> = const { Cell::new([None; N + 1]) };
    }

    static SAMPLES: Mutex<Vec<[u32; N]>> = Mutex::new(Vec::new());
    static ON: AtomicBool = AtomicBool::new(false);

    pub(super) fn set_enabled(on: bool) {
        ON.store(on, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn on() -> bool {
        ON.load(Ordering::Relaxed)
    }

    pub(super) fn start() {
        let mut s = [None; N + 1];
        s[0] = Some(Instant::now());
        STAMPS.with(|c| c.set(s));
    }

    pub(super) fn stamp(phase: Phase) {
        STAMPS.with(|c| {
            let mut s = c.get();
            s[phase as usize + 1] = Some(Instant::now());
            c.set(s);
        });
    }

    pub(super) fn finish() {
        let s = STAMPS.with(|c| c.replace([None; N + 1]));
        let mut out = [0u32; N];
        for (i, o) in out.iter_mut().enumerate() {
            match (s[i], s[i + 1]) {
                (Some(a), Some(b)) => *o = b.saturating_duration_since(a).as_nanos() as u32,
                _ => return,
            }
        }
        let mut v = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < MAX_SAMPLES {
            v.push(out);
        }
    }

    pub(super) fn reset() {
        SAMPLES.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub(super) fn medians() -> ([f64; N], usize) {
        let v = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = [0.0; N];
        for (i, o) in out.iter_mut().enumerate() {
            let mut col: Vec<u32> = v.iter().map(|s| s[i]).collect();
            col.sort_unstable();
            if let Some(m) = col.get(col.len() / 2) {
                *o = f64::from(*m) / 1e3;
            }
        }
        (out, v.len())
    }
}

#[cfg(not(feature = "profile"))]
mod imp {
    use super::{Phase, N};

    pub(super) fn set_enabled(_on: bool) {}
    #[inline(always)]
    pub(super) fn on() -> bool {
        false
    }
    #[inline(always)]
    pub(super) fn start() {}
    #[inline(always)]
    pub(super) fn stamp(_phase: Phase) {}
    #[inline(always)]
    pub(super) fn finish() {}
    pub(super) fn reset() {}
    pub(super) fn medians() -> ([f64; N], usize) {
        ([0.0; N], 0)
    }
}

/// Turns profiling on or off for the process (a no-op without the
/// `profile` feature).
pub fn set_enabled(on: bool) {
    imp::set_enabled(on)
}

/// True while profiling is on (always false without the `profile`
/// feature).
#[inline]
pub fn on() -> bool {
    imp::on()
}

/// An op starts on this thread.
#[inline]
pub fn start() {
    imp::start()
}

/// `phase` of this thread's op ended.
#[inline]
pub fn stamp(phase: Phase) {
    imp::stamp(phase)
}

/// This thread's op is enqueued: keeps its phase times if every phase was
/// stamped.
#[inline]
pub fn finish() {
    imp::finish()
}

/// Forgets the ops profiled so far (to profile one loop at a time).
pub fn reset() {
    imp::reset()
}

/// Each phase's median in microseconds, in the order of [`Phase::ALL`],
/// and the number of ops profiled (zeros and 0 without the `profile`
/// feature).
pub fn medians() -> ([f64; Phase::ALL.len()], usize) {
    imp::medians()
}
