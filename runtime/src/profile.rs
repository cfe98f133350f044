//! Where the host time of an NCCL enqueue goes, phase by phase, for
//! benchmarks (`CHORUS_NCCL_PROFILE=1`; off, each stamp is one load of a
//! cached flag). The enqueue path stamps the end of each phase of an op;
//! [`medians`] gives each phase's median over the ops profiled.

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The phases, in the order the enqueue path goes through them.
pub const PHASES: [&str; 9] = [
    "communicator lookup",
    "end event from the pool",
    "sequence number, op context",
    "clock reading",
    "work: registry entry, flight record, shared state",
    "submit: checks, lock",
    "submit: input-ready record + wait, NCCL call, end record",
    "submit: in-flight op",
    "work handle",
];
const N: usize = PHASES.len();

/// At most this many ops are kept.
const MAX_SAMPLES: usize = 1 << 21;

thread_local! {
    static STAMPS: Cell<[Option<Instant>; N + 1]> = const { Cell::new([None; N + 1]) };
}

static SAMPLES: Mutex<Vec<[u32; N]>> = Mutex::new(Vec::new());

/// True when `CHORUS_NCCL_PROFILE=1`.
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("CHORUS_NCCL_PROFILE").is_ok_and(|v| v == "1"))
}

/// An op starts on this thread.
pub fn start() {
    let mut s = [None; N + 1];
    s[0] = Some(Instant::now());
    STAMPS.with(|c| c.set(s));
}

/// Phase `phase` (0-based, see [`PHASES`]) of this thread's op ended.
pub fn stamp(phase: usize) {
    if phase < N {
        STAMPS.with(|c| {
            let mut s = c.get();
            s[phase + 1] = Some(Instant::now());
            c.set(s);
        });
    }
}

/// This thread's op is enqueued: keeps its phase times if every phase was
/// stamped.
pub fn finish() {
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

/// Forgets the ops profiled so far (to profile one loop at a time).
pub fn reset() {
    SAMPLES.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Each phase's median in microseconds, and the number of ops profiled.
pub fn medians() -> ([f64; N], usize) {
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
