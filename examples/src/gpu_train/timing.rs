//! CUDA events with timing, the marks of a profiled step, and what they
//! measure (pure functions over the harvested times, tested on the host).

use cudarc::driver::{result, sys};

use super::error::TrainError;
use chorus::Stream;

/// A CUDA event that records a GPU timestamp (`CU_EVENT_DEFAULT`).
#[derive(Debug)]
pub struct TimedEvent {
    raw: sys::CUevent,
}

// SAFETY: a CUevent is a driver handle usable from any thread.
unsafe impl Send for TimedEvent {}

impl TimedEvent {
    /// A new event (the stream's context must be current).
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming `cuEventCreate`.
    pub fn new(rank: usize) -> Result<TimedEvent, TrainError> {
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| TrainError::driver(rank, "cuEventCreate", "a timing event", e))?;
        Ok(TimedEvent { raw })
    }

    /// Records the event on `stream` (`cuEventRecord`).
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming `cuEventRecord`.
    pub fn record(&self, stream: &Stream, rank: usize) -> Result<(), TrainError> {
        // SAFETY: both handles are alive (owned by `self` and `stream`).
        unsafe { result::event::record(self.raw, stream.as_raw()) }
            .map_err(|e| TrainError::driver(rank, "cuEventRecord", "a timing event", e))
    }

    /// Microseconds from `earlier` to this event; both must have completed.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming `cuEventElapsedTime`.
    pub fn since(&self, earlier: &TimedEvent, rank: usize) -> Result<f64, TrainError> {
        // SAFETY: both events are alive and were recorded with timing.
        unsafe { result::event::elapsed(earlier.raw, self.raw) }
            .map(|ms| ms as f64 * 1e3)
            .map_err(|e| TrainError::driver(rank, "cuEventElapsedTime", "step timing", e))
    }
}

impl Drop for TimedEvent {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once (the driver defers the
        // release of an event still pending).
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// The events of one profiled step: a span per kernel or GEMM on the
/// compute stream, and per bucket the point its gradients were ready and
/// the end of its all_reduce.
#[derive(Debug, Default)]
pub struct StepProfile {
    /// (label, before, after) of each compute launch, in order.
    pub kernels: Vec<(String, TimedEvent, TimedEvent)>,
    /// Per bucket: recorded on the compute stream at the all_reduce's
    /// submission (its input is ready there).
    pub ready: Vec<TimedEvent>,
    /// Per bucket: recorded on an observer stream that waits on the
    /// all_reduce's end event.
    pub comm_end: Vec<TimedEvent>,
    /// Index in `kernels` of the last backward launch.
    pub backward_last: usize,
}

/// A profiled step's spans in µs from the step's start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spans {
    /// Compute launches: (label, start, end).
    pub compute: Vec<(String, f64, f64)>,
    /// All_reduces: (bucket, start, end), the start estimated as the later
    /// of its input being ready and the previous all_reduce's end (a
    /// communicator runs its ops in order).
    pub comm: Vec<(usize, f64, f64)>,
    /// End of backward's last launch.
    pub backward_end: f64,
    /// The step's length: start to the next step's start.
    pub step: f64,
}

impl Spans {
    /// Harvests `p` (every event has completed) against the step's start
    /// and the next step's start.
    ///
    /// # Errors
    ///
    /// [`TrainError::Driver`] naming `cuEventElapsedTime`.
    pub fn harvest(
        p: &StepProfile,
        start: &TimedEvent,
        next: &TimedEvent,
        rank: usize,
    ) -> Result<Spans, TrainError> {
        let mut s = Spans {
            step: next.since(start, rank)?,
            ..Spans::default()
        };
        for (label, a, b) in &p.kernels {
            s.compute
                .push((label.clone(), a.since(start, rank)?, b.since(start, rank)?));
        }
        s.backward_end = s.compute.get(p.backward_last).map_or(0.0, |k| k.2);
        let mut prev_end = 0.0f64;
        for (k, (r, e)) in p.ready.iter().zip(&p.comm_end).enumerate() {
            let (r, e) = (r.since(start, rank)?, e.since(start, rank)?);
            let begin = r.max(prev_end).min(e);
            s.comm.push((k, begin, e));
            prev_end = e;
        }
        Ok(s)
    }

    /// Time the compute stream had no launch running: the step minus the
    /// union of the compute spans.
    pub fn gpu_idle(&self) -> f64 {
        let spans: Vec<(f64, f64)> = self.compute.iter().map(|c| (c.1, c.2)).collect();
        (self.step - union_len(&spans)).max(0.0)
    }

    /// Communication not hidden behind compute: the union of the
    /// all_reduce spans minus the time a compute launch ran.
    pub fn exposed_comm(&self) -> f64 {
        let comm: Vec<(f64, f64)> = self.comm.iter().map(|c| (c.1, c.2)).collect();
        let both: Vec<(f64, f64)> = comm
            .iter()
            .copied()
            .chain(self.compute.iter().map(|c| (c.1, c.2)))
            .collect();
        let compute: Vec<(f64, f64)> = self.compute.iter().map(|c| (c.1, c.2)).collect();
        (union_len(&both) - union_len(&compute)).max(0.0)
    }

    /// How far the last all_reduce ended after backward's end.
    pub fn comm_after_backward(&self) -> f64 {
        self.comm
            .iter()
            .map(|c| c.2)
            .fold(0.0f64, f64::max)
            .sub_floor(self.backward_end)
    }

    /// The step as Chrome trace events (`chrome://tracing`, Perfetto):
    /// compute on thread 1, all_reduces on thread 2, times in µs.
    pub fn chrome_trace(&self, rank: usize, step: usize) -> Vec<serde_json::Value> {
        let mut ev = vec![
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": 1,
                "args": {"name": "compute stream"}}),
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": 2,
                "args": {"name": "all_reduce (NCCL)"}}),
            serde_json::json!({"name": format!("step {step}"), "ph": "X", "pid": rank, "tid": 0,
                "ts": 0.0, "dur": self.step}),
        ];
        for (label, a, b) in &self.compute {
            ev.push(
                serde_json::json!({"name": label, "ph": "X", "pid": rank, "tid": 1,
                "ts": a, "dur": (b - a).max(0.0)}),
            );
        }
        for (k, a, b) in &self.comm {
            ev.push(
                serde_json::json!({"name": format!("all_reduce bucket {k}"), "ph": "X",
                "pid": rank, "tid": 2, "ts": a, "dur": (b - a).max(0.0)}),
            );
        }
        ev
    }
}

trait SubFloor {
    fn sub_floor(self, other: f64) -> f64;
}

impl SubFloor for f64 {
    fn sub_floor(self, other: f64) -> f64 {
        (self - other).max(0.0)
    }
}

/// Length of the union of intervals.
pub fn union_len(spans: &[(f64, f64)]) -> f64 {
    let mut v: Vec<(f64, f64)> = spans.iter().copied().filter(|s| s.1 > s.0).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (a, b) in v {
        match cur {
            Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    total + cur.map_or(0.0, |(a, b)| b - a)
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_merges_overlaps() {
        assert_eq!(union_len(&[(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]), 4.0);
        assert_eq!(union_len(&[]), 0.0);
    }

    #[test]
    fn idle_and_exposure_of_a_made_up_step() {
        let s = Spans {
            compute: vec![
                ("fwd".into(), 0.0, 10.0),
                ("bwd".into(), 12.0, 20.0),
                ("sgd".into(), 26.0, 28.0),
            ],
            comm: vec![(0, 15.0, 18.0), (1, 18.0, 25.0)],
            backward_end: 20.0,
            step: 30.0,
        };
        assert_eq!(s.gpu_idle(), 10.0);
        assert_eq!(s.exposed_comm(), 5.0);
        assert_eq!(s.comm_after_backward(), 5.0);
        assert_eq!(s.chrome_trace(0, 7).len(), 3 + 3 + 2);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
