//! The flight recorder: a bounded ring of the last ops of a group, with their
//! state and timestamps, dumped as JSON on timeout, on error and on demand.
//!
//! `chorus-trace` reads the dumps of every rank and names the first sequence
//! number at which the ranks disagree (see [`analyze`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::sync::{lock, Mutex};

/// Default number of ops a group's recorder keeps.
pub const DEFAULT_CAPACITY: usize = 2000;

/// Where an op stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Submitted to the backend.
    Scheduled,
    /// The backend started running it.
    Started,
    /// Finished successfully.
    Completed,
    /// Failed (the error is recorded).
    Failed,
}

/// What the recorder knows of an op when it is submitted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpMeta {
    /// Element type name (`"f32"`), if the op has data (borrowed on the
    /// hot path, owned when read back from a dump).
    pub dtype: Option<Cow<'static, str>>,
    /// Element count of the op's (input) buffer.
    pub count: u64,
    /// Root of broadcast/reduce, or peer of send/recv.
    pub peer: Option<usize>,
    /// For an op chorus issued for itself (`admit`): its number among those
    /// ops (see [`OpContext`](crate::OpContext)); such records are not
    /// compared across ranks by sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal: Option<u64>,
}

/// One op in the recorder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRecord {
    /// Sequence number (collective number, or pair message number for P2P).
    pub seq: u64,
    /// The op's name.
    pub op: Cow<'static, str>,
    /// True for collectives (their `seq` is comparable across ranks).
    pub collective: bool,
    /// Dtype, count, root or peer.
    #[serde(flatten)]
    pub meta: OpMeta,
    /// Current state.
    pub state: OpState,
    /// Microseconds since the Unix epoch when it was submitted.
    pub scheduled_us: u64,
    /// When the backend started it.
    pub started_us: Option<u64>,
    /// When it completed or failed.
    pub completed_us: Option<u64>,
    /// The error, if it failed.
    pub error: Option<String>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// `at` as microseconds since the Unix epoch, without reading the clock:
/// each thread keeps an (`Instant`, wall-clock) anchor, read anew once a
/// second (so the monotonic clock's drift from wall time stays small).
pub(crate) fn wall_us(at: Instant) -> u64 {
    thread_local! {
        static ANCHOR: std::cell::Cell<Option<(Instant, u64)>> = const { std::cell::Cell::new(None) };
    }
    ANCHOR.with(|a| {
        let (i0, w0) = match a.get() {
            Some((i0, w0)) if at >= i0 && at - i0 < Duration::from_secs(1) => (i0, w0),
            _ => {
                let anchor = (Instant::now(), now_us());
                a.set(Some(anchor));
                anchor
            }
        };
        if at >= i0 {
            w0.saturating_add((at - i0).as_micros() as u64)
        } else {
            w0.saturating_sub((i0 - at).as_micros() as u64)
        }
    })
}

struct Ring {
    /// Id of `entries[0]`.
    first_id: u64,
    entries: VecDeque<OpRecord>,
}

impl Ring {
    /// Appends a record (dropping the oldest when `capacity` is reached)
    /// and returns its id.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        capacity: usize,
        seq: u64,
        op: &'static str,
        collective: bool,
        meta: OpMeta,
        at_us: u64,
        started: bool,
    ) -> u64 {
        if self.entries.len() == capacity {
            self.entries.pop_front();
            self.first_id += 1;
        }
        self.entries.push_back(OpRecord {
            seq,
            op: Cow::Borrowed(op),
            collective,
            meta,
            state: if started {
                OpState::Started
            } else {
                OpState::Scheduled
            },
            scheduled_us: at_us,
            started_us: started.then_some(at_us),
            completed_us: None,
            error: None,
        });
        self.first_id + self.entries.len() as u64 - 1
    }
}

/// A flight recorder's ring held for several records in a row
/// ([`FlightRecorder::appender`]).
pub(crate) struct Appender<'a> {
    capacity: usize,
    ring: crate::sync::MutexGuard<'a, Ring>,
}

impl Appender<'_> {
    /// Records an op submitted and started at `at_us` (microseconds since
    /// the Unix epoch); returns its id.
    pub(crate) fn started(
        &mut self,
        seq: u64,
        op: &'static str,
        collective: bool,
        meta: OpMeta,
        at_us: u64,
    ) -> u64 {
        self.ring
            .push(self.capacity, seq, op, collective, meta, at_us, true)
    }
}

/// A bounded ring of a group's last ops.
pub struct FlightRecorder {
    capacity: usize,
    ring: Mutex<Ring>,
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("capacity", &self.capacity)
            .field("len", &lock(&self.ring).entries.len())
            .finish()
    }
}

impl FlightRecorder {
    /// A recorder that keeps the last `capacity` ops (at least 1).
    pub fn new(capacity: usize) -> Self {
        FlightRecorder {
            capacity: capacity.max(1),
            ring: Mutex::new(Ring {
                first_id: 0,
                entries: VecDeque::new(),
            }),
        }
    }

    /// Records a submitted op; returns its id for the later state changes.
    pub fn scheduled(&self, seq: u64, op: &'static str, collective: bool, meta: OpMeta) -> u64 {
        lock(&self.ring).push(self.capacity, seq, op, collective, meta, now_us(), false)
    }

    /// Records an op that was submitted and started at `at` (a backend that
    /// starts ops as it submits them); returns its id. Reads no clock:
    /// `at` becomes wall-clock time through a per-thread anchor.
    pub fn started_at(
        &self,
        seq: u64,
        op: &'static str,
        collective: bool,
        meta: OpMeta,
        at: Instant,
    ) -> u64 {
        lock(&self.ring).push(self.capacity, seq, op, collective, meta, wall_us(at), true)
    }

    /// Holds the ring for several records in a row (the ops of a group,
    /// recorded under one lock with one clock reading).
    pub(crate) fn appender(&self) -> Appender<'_> {
        Appender {
            capacity: self.capacity,
            ring: lock(&self.ring),
        }
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut OpRecord)) {
        let mut ring = lock(&self.ring);
        let Some(i) = id.checked_sub(ring.first_id) else {
            return; // evicted
        };
        if let Some(e) = ring.entries.get_mut(i as usize) {
            f(e);
        }
    }

    /// The backend started op `id`.
    pub fn started(&self, id: u64) {
        self.update(id, |e| {
            if e.state == OpState::Scheduled {
                e.state = OpState::Started;
                e.started_us = Some(now_us());
            }
        });
    }

    /// Op `id` completed (`error` is `None`) or failed.
    pub fn finished(&self, id: u64, error: Option<String>) {
        self.finished_range(id, 1, error);
    }

    /// Ops `first .. first + n` completed (`error` is `None`) or failed
    /// together (the ops of one group launch): one lock, one clock
    /// reading. Records already finished keep their outcome.
    pub fn finished_range(&self, first: u64, n: u64, error: Option<String>) {
        let mut ring = lock(&self.ring);
        // Records evicted from the ring are skipped.
        let start = first.max(ring.first_id);
        let end = first.saturating_add(n);
        if start >= end {
            return;
        }
        let at = now_us();
        let base = ring.first_id;
        for id in start..end {
            let Some(e) = ring.entries.get_mut((id - base) as usize) else {
                break;
            };
            if matches!(e.state, OpState::Completed | OpState::Failed) {
                continue;
            }
            e.state = if error.is_some() {
                OpState::Failed
            } else {
                OpState::Completed
            };
            e.completed_us = Some(at);
            e.error.clone_from(&error);
        }
    }

    /// A copy of the recorded ops, oldest first.
    pub fn snapshot(&self) -> Vec<OpRecord> {
        lock(&self.ring).entries.iter().cloned().collect()
    }
}

/// One group's part of a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDump {
    /// The process's rank in the group.
    pub rank: usize,
    /// Number of ranks in the group.
    pub size: usize,
    /// Recorded ops, oldest first.
    pub ops: Vec<OpRecord>,
}

/// One process's dump: every group's recorded ops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    /// Global rank of the process (its rank in the world group).
    pub rank: usize,
    /// Why the dump was written (`"timeout"`, `"error"`, `"request"`, `"SIGUSR1"`).
    pub reason: String,
    /// When, in microseconds since the Unix epoch.
    pub time_us: u64,
    /// Recorded ops by group name.
    pub groups: BTreeMap<String, GroupDump>,
}

impl Dump {
    /// A dump of `groups` now.
    pub fn new(rank: usize, reason: &str, groups: BTreeMap<String, GroupDump>) -> Dump {
        Dump {
            rank,
            reason: reason.to_string(),
            time_us: now_us(),
            groups,
        }
    }

    /// The file name of rank `rank`'s dump inside the dump folder.
    pub fn file_name(rank: usize) -> String {
        format!("chorus-trace-rank{rank}.json")
    }
}

/// What `chorus-trace` concludes for one group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupReport {
    /// The group.
    pub group: String,
    /// Number of ranks in the group.
    pub size: usize,
    /// Group ranks that left no dump (dead, stopped, or hung before dumping).
    pub missing: Vec<usize>,
    /// The first collective sequence number at which the ranks disagree, if
    /// any.
    pub first_divergence: Option<Divergence>,
    /// Each dumped rank's last completed collective sequence number (0 if
    /// none).
    pub last_completed: BTreeMap<usize, u64>,
    /// Each dumped rank's last issued collective sequence number (0 if none).
    pub last_issued: BTreeMap<usize, u64>,
}

/// The first point where ranks disagree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Collective sequence number.
    pub seq: u64,
    /// What each dumped rank issued at that number (`None`: never issued
    /// it).
    pub issued: BTreeMap<usize, Option<String>>,
    /// Ranks that never issued it, or left no dump while the others were
    /// stuck at it: they are behind.
    pub behind: Vec<usize>,
    /// Ranks whose op differs from the majority (op, dtype or count).
    pub mismatched: Vec<usize>,
}

fn describe(r: &OpRecord) -> String {
    format!(
        "{}(dtype={}, count={}{})",
        r.op,
        r.meta.dtype.as_deref().unwrap_or("-"),
        r.meta.count,
        r.meta
            .peer
            .map(|p| format!(", root={p}"))
            .unwrap_or_default()
    )
}

/// Compares the dumps of several processes, group by group.
///
/// A group's collectives are compared by sequence number. The first number
/// at which some rank issued nothing, or ranks issued different ops, dtypes
/// or counts, is the divergence; ranks that never issued it are behind. If
/// the dumped ranks agree but some ranks left no dump, the first number the
/// dumped ranks did not all complete is where the job is stuck, and the
/// ranks without a dump are named as behind. The oldest entries may have
/// been evicted from a ring: comparison starts at the first number every
/// rank still holds.
pub fn analyze(dumps: &[Dump]) -> Vec<GroupReport> {
    type PerRank<'a> = BTreeMap<usize, BTreeMap<u64, &'a OpRecord>>;
    let mut groups: BTreeMap<&str, (usize, PerRank<'_>)> = BTreeMap::new();
    for d in dumps {
        for (name, g) in &d.groups {
            let entry = groups
                .entry(name)
                .or_insert_with(|| (g.size, BTreeMap::new()));
            entry.0 = entry.0.max(g.size);
            let per_rank = entry.1.entry(g.rank).or_default();
            for op in g
                .ops
                .iter()
                .filter(|o| o.collective && o.meta.internal.is_none())
            {
                per_rank.insert(op.seq, op);
            }
        }
    }
    let mut reports = Vec::new();
    for (name, (size, ranks)) in groups {
        let missing: Vec<usize> = (0..size).filter(|r| !ranks.contains_key(r)).collect();
        let last_issued: BTreeMap<usize, u64> = ranks
            .iter()
            .map(|(r, ops)| (*r, ops.keys().next_back().copied().unwrap_or(0)))
            .collect();
        let last_completed: BTreeMap<usize, u64> = ranks
            .iter()
            .map(|(r, ops)| {
                let s = ops
                    .values()
                    .filter(|o| o.state == OpState::Completed)
                    .map(|o| o.seq)
                    .max()
                    .unwrap_or(0);
                (*r, s)
            })
            .collect();
        let start = ranks
            .values()
            .filter_map(|ops| ops.keys().next().copied())
            .max()
            .unwrap_or(1);
        let end = last_issued.values().copied().max().unwrap_or(0);
        let mut first_divergence = None;
        for seq in start..=end {
            let issued: BTreeMap<usize, Option<String>> = ranks
                .iter()
                .map(|(r, ops)| (*r, ops.get(&seq).map(|o| describe(o))))
                .collect();
            let behind: Vec<usize> = issued
                .iter()
                .filter(|(_, d)| d.is_none())
                .map(|(r, _)| *r)
                .collect();
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for d in issued.values().flatten() {
                *counts.entry(d.as_str()).or_default() += 1;
            }
            let stuck = !missing.is_empty()
                && ranks
                    .values()
                    .any(|ops| ops.get(&seq).is_some_and(|o| o.state != OpState::Completed));
            if behind.is_empty() && counts.len() <= 1 && !stuck {
                continue;
            }
            let majority = counts
                .iter()
                .max_by_key(|(_, c)| **c)
                .map(|(d, _)| d.to_string());
            let mismatched = issued
                .iter()
                .filter(|(_, d)| d.is_some() && d.as_deref() != majority.as_deref())
                .map(|(r, _)| *r)
                .collect();
            let mut behind = behind;
            behind.extend(missing.iter().copied());
            behind.sort_unstable();
            first_divergence = Some(Divergence {
                seq,
                issued,
                behind,
                mismatched,
            });
            break;
        }
        reports.push(GroupReport {
            group: name.to_string(),
            size,
            missing,
            first_divergence,
            last_completed,
            last_issued,
        });
    }
    reports
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn meta(count: u64) -> OpMeta {
        OpMeta {
            dtype: Some("f32".into()),
            count,
            peer: None,
            internal: None,
        }
    }

    #[test]
    fn started_at_records_both_times_from_the_instant_given() {
        let fr = FlightRecorder::new(4);
        let before = now_us();
        let t = Instant::now();
        let id = fr.started_at(7, "all_reduce", true, meta(3), t);
        // An instant 2 s in the past re-anchors and still maps back.
        let earlier = t.checked_sub(Duration::from_secs(2)).unwrap_or(t);
        fr.started_at(8, "broadcast", true, meta(1), earlier);
        let after = now_us();
        let snap = fr.snapshot();
        let r = &snap[id as usize];
        assert_eq!(r.state, OpState::Started);
        assert_eq!(r.started_us, Some(r.scheduled_us));
        // Within a millisecond of the wall clock around the call.
        assert!(r.scheduled_us + 1_000 >= before && r.scheduled_us <= after + 1_000);
        let gap = r.scheduled_us.saturating_sub(snap[1].scheduled_us);
        let want = t.saturating_duration_since(earlier).as_micros() as u64;
        assert!(gap.abs_diff(want) < 1_000, "gap {gap} µs, want {want} µs");
    }

    #[test]
    fn ring_is_bounded_and_tracks_states() {
        let fr = FlightRecorder::new(3);
        let ids: Vec<u64> = (1..=5)
            .map(|s| fr.scheduled(s, "all_reduce", true, meta(s)))
            .collect();
        fr.started(ids[4]);
        fr.finished(ids[3], None);
        fr.finished(ids[2], Some("boom".into()));
        fr.started(ids[0]); // evicted: ignored
        let snap = fr.snapshot();
        assert_eq!(
            snap.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        assert_eq!(snap[0].state, OpState::Failed);
        assert_eq!(snap[0].error.as_deref(), Some("boom"));
        assert_eq!(snap[1].state, OpState::Completed);
        assert_eq!(snap[2].state, OpState::Started);
    }

    fn dump(rank: usize, ops: &[(u64, &'static str, u64, OpState)]) -> Dump {
        dump_of(rank, 3, ops)
    }

    fn dump_of(rank: usize, size: usize, ops: &[(u64, &'static str, u64, OpState)]) -> Dump {
        let fr = FlightRecorder::new(100);
        for &(seq, op, count, state) in ops {
            let id = fr.scheduled(seq, op, true, meta(count));
            match state {
                OpState::Completed => fr.finished(id, None),
                OpState::Started => fr.started(id),
                _ => {}
            }
        }
        let mut groups = BTreeMap::new();
        groups.insert(
            "world".to_string(),
            GroupDump {
                rank,
                size,
                ops: fr.snapshot(),
            },
        );
        Dump::new(rank, "test", groups)
    }

    #[test]
    fn names_the_rank_that_is_behind() {
        use OpState::*;
        let d0 = dump(
            0,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_reduce", 4, Started),
            ],
        );
        let d1 = dump(1, &[(1, "all_reduce", 4, Completed)]);
        let d2 = dump(
            2,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_reduce", 4, Started),
            ],
        );
        let rep = analyze(&[d0, d1, d2]);
        let div = rep[0].first_divergence.as_ref().unwrap();
        assert_eq!(div.seq, 2);
        assert_eq!(div.behind, vec![1]);
        assert!(div.mismatched.is_empty());
        assert_eq!(rep[0].last_completed[&1], 1);
        assert_eq!(rep[0].last_issued[&0], 2);
    }

    #[test]
    fn names_a_mismatched_op() {
        use OpState::*;
        let d0 = dump(
            0,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_reduce", 12, Started),
            ],
        );
        let d1 = dump(
            1,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_gather", 10, Started),
            ],
        );
        let d2 = dump(
            2,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_reduce", 12, Started),
            ],
        );
        let rep = analyze(&[d0, d1, d2]);
        let div = rep[0].first_divergence.as_ref().unwrap();
        assert_eq!(div.seq, 2);
        assert_eq!(div.mismatched, vec![1]);
        assert!(div.issued[&1].as_ref().unwrap().contains("all_gather"));
    }

    #[test]
    fn a_rank_without_a_dump_is_named_where_the_others_are_stuck() {
        use OpState::*;
        let d0 = dump(
            0,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_reduce", 4, Started),
            ],
        );
        let d2 = dump(
            2,
            &[
                (1, "all_reduce", 4, Completed),
                (2, "all_reduce", 4, Started),
            ],
        );
        let rep = analyze(&[d0, d2]);
        assert_eq!(rep[0].missing, vec![1]);
        let div = rep[0].first_divergence.as_ref().unwrap();
        assert_eq!(div.seq, 2);
        assert_eq!(div.behind, vec![1]);
    }

    #[test]
    fn agreeing_ranks_have_no_divergence() {
        use OpState::*;
        let d0 = dump_of(0, 2, &[(1, "barrier", 0, Completed)]);
        let d1 = dump_of(1, 2, &[(1, "barrier", 0, Completed)]);
        let rep = analyze(&[d0, d1]);
        assert!(rep[0].first_divergence.is_none());
    }

    #[test]
    fn dump_round_trips_through_json() {
        let d = dump(3, &[(1, "all_reduce", 4, OpState::Completed)]);
        let s = serde_json::to_string(&d).unwrap();
        let back: Dump = serde_json::from_str(&s).unwrap();
        assert_eq!(back, d);
    }
}
