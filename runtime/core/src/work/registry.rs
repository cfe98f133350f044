//! The registry of in-flight ops of one group.
//!
//! Every submitted op has an entry until its backend completes it. The
//! registry is what abort, timeouts and the watchdog act on: it can fail every
//! pending work of the group at once, or those past their deadline. It holds
//! no buffers itself; the backend keeps them until the op is done, so failing
//! a work early never frees memory the backend still touches.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Instant;

use crate::error::{OpContext, WorkError};
use crate::flight_recorder::{Appender, FlightRecorder, OpMeta};
use crate::sync::{lock, Arc, DynArc, Mutex, MutexGuard};

/// Tells whether an op has finished, without its work: the watchdog asks
/// it before timing out an op past its deadline. An NCCL op's end event is
/// one: the op may have finished long ago while nobody has polled its work
/// yet (works are completed lazily, when polled, dropped or taken back
/// stream-ordered).
pub trait FinishedProbe: Send + Sync {
    /// True once the op has finished. Must not block.
    fn finished(&self) -> bool;
}

/// Something the registry can fail: a type-erased handle on a work's
/// shared state (the registry never holds the buffers).
pub(crate) trait Fail: Send + Sync {
    fn fail(&self, err: WorkError);
    /// The op (the first op of a batch).
    fn context(&self) -> &OpContext;
    /// Every op it stands for, in submission order.
    fn contexts(&self, out: &mut Vec<OpContext>) {
        out.push(self.context().clone());
    }
}

/// The registry's handle on the works of a batch ([`Registry::begin_batch`]):
/// failing it fails each of them with the error made theirs.
struct BatchEntry {
    first: OpContext,
    /// Every op of the batch, in submission order (a member's work may
    /// stand for several: a group's one work for all of its ops), shared
    /// with whoever registered them ([`WorkBatch::register`]).
    ops: std::sync::Arc<[OpContext]>,
    members: Vec<DynArc<dyn Fail>>,
}

impl Fail for BatchEntry {
    fn fail(&self, err: WorkError) {
        for m in &self.members {
            m.fail(err.for_op(m.context().clone()));
        }
    }

    fn context(&self) -> &OpContext {
        &self.first
    }

    fn contexts(&self, out: &mut Vec<OpContext>) {
        out.extend(self.ops.iter().cloned());
    }
}

struct Entry {
    submitted: Instant,
    deadline: Option<Instant>,
    /// The work's shared state, which also names the op.
    fail: DynArc<dyn Fail>,
    /// Asked before the op is reported expired.
    probe: Option<DynArc<dyn FinishedProbe>>,
    /// Its flight record, if the registry records (a batch's first; its
    /// ops' records are `rec .. rec + ops`).
    rec: Option<u64>,
    /// How many ops it stands for (1, or a batch's members).
    ops: u32,
    /// A batch: its records are marked when it is failed, since its
    /// members do not record their own ends.
    batch: bool,
}

type AbortHook = Box<dyn Fn(&WorkError) + Send + Sync>;
type ErrorHook = Box<dyn Fn(&WorkError) + Send + Sync>;
type DeadlineHook = Box<dyn Fn(Instant) + Send + Sync>;

/// The pending entries by registry-local id, in submission order (sequence
/// numbers are per op family and may repeat between collectives and P2P
/// ops). Ids are handed out in order and ops mostly finish in order, so a
/// ring indexed by `id - base` does without a per-op allocation or a tree.
/// An entry that stays while many later ones finish (a work nobody polls)
/// moves to `stragglers` once the ring is [`RING_SLOTS`] long, so the ring
/// stays bounded.
#[derive(Default)]
struct Entries {
    /// Id of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<Entry>>,
    /// Entries older than `base`.
    stragglers: BTreeMap<u64, Entry>,
    /// Entries held, in `slots` and `stragglers`.
    live: usize,
    /// Ops those entries stand for.
    ops: usize,
}

/// The ring's length beyond which its oldest entry moves to the stragglers.
const RING_SLOTS: usize = 1024;

impl Entries {
    /// Pending ops (a batch counts its members).
    fn ops(&self) -> usize {
        self.ops
    }

    /// Adds the entry of `id`, the next id (one past the last added).
    fn push(&mut self, id: u64, e: Entry) {
        debug_assert_eq!(id, self.base + self.slots.len() as u64);
        self.ops += e.ops as usize;
        self.slots.push_back(Some(e));
        self.live += 1;
        self.trim();
    }

    /// Drops the finished prefix of the ring and moves what keeps it
    /// longer than [`RING_SLOTS`] to the stragglers.
    fn trim(&mut self) {
        loop {
            let long = self.slots.len() > RING_SLOTS;
            match self.slots.front_mut() {
                Some(None) => {}
                Some(front) if long => {
                    if let Some(e) = front.take() {
                        self.stragglers.insert(self.base, e);
                    }
                }
                _ => return,
            }
            self.slots.pop_front();
            self.base += 1;
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = match id.checked_sub(self.base) {
            None => self.stragglers.remove(&id)?,
            Some(i) => self.slots.get_mut(usize::try_from(i).ok()?)?.take()?,
        };
        self.live -= 1;
        self.ops -= e.ops as usize;
        self.trim();
        Some(e)
    }

    /// Every entry with its id, in submission order.
    fn iter(&self) -> impl Iterator<Item = (u64, &Entry)> {
        let base = self.base;
        self.stragglers.iter().map(|(id, e)| (*id, e)).chain(
            self.slots
                .iter()
                .enumerate()
                .filter_map(move |(i, e)| Some((base + i as u64, e.as_ref()?))),
        )
    }

    /// Takes every entry, in submission order.
    fn drain(&mut self) -> Vec<Entry> {
        self.base += self.slots.len() as u64;
        self.live = 0;
        self.ops = 0;
        let mut out: Vec<Entry> = std::mem::take(&mut self.stragglers).into_values().collect();
        out.extend(self.slots.drain(..).flatten());
        out
    }
}

struct Inner {
    entries: Entries,
    next_id: u64,
    /// Set once the group failed or was aborted; later submissions fail with it.
    errored: Option<WorkError>,
    /// Told each new entry's deadline (see [`Registry::set_deadline_hook`]).
    deadline_hook: Option<DeadlineHook>,
}

impl Inner {
    fn push(&mut self, id: u64, e: Entry) {
        if let (Some(hook), Some(d)) = (&self.deadline_hook, e.deadline) {
            hook(d);
        }
        self.entries.push(id, e);
    }
}

/// Registry of the in-flight ops of one group.
pub struct Registry {
    inner: Mutex<Inner>,
    /// Called once when the group is aborted (closes sockets, aborts NCCL
    /// communicators); set by the backend.
    abort_hook: Mutex<Option<AbortHook>>,
    /// Called once with the group's first error, whichever path failed it
    /// (error propagation publishes it).
    error_hook: Mutex<Option<ErrorHook>>,
    /// The group's flight recorder, if it keeps one.
    recorder: Option<Arc<FlightRecorder>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("Registry")
            .field("pending", &inner.entries.ops())
            .field("errored", &inner.errored.is_some())
            .finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry {
            inner: Mutex::new(Inner {
                entries: Entries::default(),
                next_id: 0,
                errored: None,
                deadline_hook: None,
            }),
            abort_hook: Mutex::new(None),
            error_hook: Mutex::new(None),
            recorder: None,
        }
    }

    /// An empty registry that records every op in `recorder`.
    pub fn with_recorder(recorder: Arc<FlightRecorder>) -> Self {
        Registry {
            recorder: Some(recorder),
            ..Self::new()
        }
    }

    /// The group's flight recorder, if any.
    pub fn recorder(&self) -> Option<&Arc<FlightRecorder>> {
        self.recorder.as_ref()
    }

    /// Sets what [`abort`](Self::abort) does to the backend besides failing
    /// the pending works (close connections, abort communicators).
    pub fn set_abort_hook(&self, hook: impl Fn(&WorkError) + Send + Sync + 'static) {
        *lock(&self.abort_hook) = Some(Box::new(hook));
    }

    /// Sets what runs once with the group's first error (the one that marks
    /// it failed), whether it came through [`abort`](Self::abort) or
    /// [`fail_all`](Self::fail_all). It finishes before any pending work of
    /// the group is failed, even by a concurrent abort (so what it starts,
    /// e.g. publishing the error to the peers, is under way before the
    /// owner of a work can see the error and exit). It must not block and
    /// must not call [`abort`](Self::abort) or [`fail_all`](Self::fail_all).
    pub fn set_error_hook(&self, hook: impl Fn(&WorkError) + Send + Sync + 'static) {
        *lock(&self.error_hook) = Some(Box::new(hook));
    }

    /// Sets what is told the deadline of every op entered from now on, as
    /// it is entered (the watchdog: so that it can sleep until the earliest
    /// deadline instead of looking in on a fixed beat). It runs under the
    /// registry's lock, on the submitting thread: it must be cheap, must
    /// not block and must not call back into the registry.
    pub fn set_deadline_hook(&self, hook: impl Fn(Instant) + Send + Sync + 'static) {
        lock(&self.inner).deadline_hook = Some(Box::new(hook));
    }

    /// Marks the group failed with `cause` unless it already is (first
    /// cause wins). The first caller gets the error hook's lock, taken
    /// before the claim is visible, to run the hook with; everyone else
    /// waits for a hook still running (so no work fails before it is done).
    fn claim(&self, cause: &WorkError) -> Option<MutexGuard<'_, Option<ErrorHook>>> {
        let mut inner = lock(&self.inner);
        if inner.errored.is_none() {
            inner.errored = Some(cause.clone());
            // Lock order: inner, then error_hook (nothing takes them the
            // other way round).
            let hook = lock(&self.error_hook);
            drop(inner);
            Some(hook)
        } else {
            drop(inner);
            drop(lock(&self.error_hook));
            None
        }
    }

    /// Runs the error hook with the group's first error.
    fn first_error(hook: MutexGuard<'_, Option<ErrorHook>>, cause: &WorkError) {
        if let Some(hook) = hook.as_ref() {
            hook(cause);
        }
    }

    /// Adds a pending op submitted at `submitted` and, if the registry
    /// records, records it with `record` (only once it is accepted). `make`
    /// builds the work's shared state from the op, its registry id and its
    /// flight-record id, under the registry's lock; the entry keeps a
    /// handle on it and the caller gets it back.
    pub(crate) fn insert<F: Fail + 'static>(
        &self,
        ctx: OpContext,
        submitted: Instant,
        deadline: Option<Instant>,
        probe: Option<std::sync::Arc<dyn FinishedProbe>>,
        record: impl FnOnce(&FlightRecorder, &OpContext) -> u64,
        make: impl FnOnce(OpContext, u64, Option<u64>) -> DynArc<F>,
    ) -> Result<DynArc<F>, WorkError> {
        let mut inner = lock(&self.inner);
        if let Some(cause) = &inner.errored {
            return Err(WorkError::GroupErrored {
                ctx,
                cause: std::sync::Arc::new(cause.clone()),
            });
        }
        // Lock order: inner, then the recorder's ring (nothing takes them
        // the other way round).
        let rec = self.recorder.as_ref().map(|r| record(r, &ctx));
        let id = inner.next_id;
        inner.next_id += 1;
        let shared = make(ctx, id, rec);
        inner.push(
            id,
            Entry {
                submitted,
                deadline,
                fail: shared.clone(),
                probe,
                rec,
                ops: 1,
                batch: false,
            },
        );
        Ok(shared)
    }

    pub(crate) fn remove(&self, id: u64) {
        lock(&self.inner).entries.remove(id);
    }

    /// Starts entering the ops of one launch as one entry: their flight
    /// records, their works and the entry are all made under one hold of
    /// the registry's lock (and of the recorder's), with one clock reading
    /// `submitted`. `first` is the first op, named by the error if the
    /// group has already failed; `len`, how many there are (a hint).
    pub(crate) fn begin_batch(
        &self,
        first: &OpContext,
        len: usize,
        submitted: Instant,
    ) -> Result<BatchInsert<'_>, WorkError> {
        let inner = lock(&self.inner);
        if let Some(cause) = &inner.errored {
            return Err(WorkError::GroupErrored {
                ctx: first.clone(),
                cause: std::sync::Arc::new(cause.clone()),
            });
        }
        let id = inner.next_id;
        // Lock order: inner, then the recorder's ring (as in `insert`).
        let appender = self.recorder.as_ref().map(|r| r.appender());
        Ok(BatchInsert {
            inner,
            appender,
            at_us: crate::flight_recorder::wall_us(submitted),
            id,
            first_rec: None,
            ops: Vec::with_capacity(len),
            members: Vec::with_capacity(len),
        })
    }

    /// Enters the batch begun with [`begin_batch`](Self::begin_batch) as
    /// one entry (none if it has no member) and returns its ops.
    pub(crate) fn commit_batch(
        &self,
        batch: BatchInsert<'_>,
        submitted: Instant,
        deadline: Option<Instant>,
        probe: Option<std::sync::Arc<dyn FinishedProbe>>,
    ) -> std::sync::Arc<[OpContext]> {
        let BatchInsert {
            mut inner,
            appender,
            id,
            first_rec,
            ops,
            members,
            ..
        } = batch;
        drop(appender);
        let ops: std::sync::Arc<[OpContext]> = ops.into();
        let Some(first) = ops.first().cloned() else {
            return ops;
        };
        if members.is_empty() {
            return ops;
        }
        inner.next_id += 1;
        let n = u32::try_from(ops.len()).unwrap_or(u32::MAX);
        inner.push(
            id,
            Entry {
                submitted,
                deadline,
                fail: DynArc::new(BatchEntry {
                    first,
                    ops: ops.clone(),
                    members,
                }),
                probe,
                rec: first_rec,
                ops: n,
                batch: true,
            },
        );
        ops
    }

    /// Retires entry `id` (a batch whose ops ended together) and marks its
    /// flight records with the outcome (`error`, if they failed). False if
    /// it was no longer there (failed, timed out or retired already).
    pub(crate) fn retire(&self, id: u64, error: impl FnOnce() -> Option<String>) -> bool {
        let Some(e) = lock(&self.inner).entries.remove(id) else {
            return false;
        };
        if let (Some(r), Some(rec)) = (&self.recorder, e.rec) {
            r.finished_range(rec, u64::from(e.ops), error());
        }
        true
    }

    /// Marks the records of a failed batch entry (its members do not).
    fn record_failed(&self, e: &Entry, err: &WorkError) {
        if let (true, Some(r), Some(rec)) = (e.batch, &self.recorder, e.rec) {
            r.finished_range(rec, u64::from(e.ops), Some(err.to_string()));
        }
    }

    /// The first error of the group, if it has failed.
    pub fn errored(&self) -> Option<WorkError> {
        lock(&self.inner).errored.clone()
    }

    /// Marks the group failed with `cause` (first cause wins) and fails
    /// every pending work with it. Returns how many works were failed.
    ///
    /// Does not touch the backend; see [`abort`](Self::abort) for that.
    pub fn fail_all(&self, cause: &WorkError) -> usize {
        if let Some(hook) = self.claim(cause) {
            Self::first_error(hook, cause);
        }
        let drained: Vec<Entry> = lock(&self.inner).entries.drain();
        let mut n = 0;
        for e in drained {
            n += e.ops as usize;
            let err = cause.for_op(e.fail.context().clone());
            self.record_failed(&e, &err);
            e.fail.fail(err);
        }
        n
    }

    /// Aborts the group: marks it failed with `cause` (first cause wins),
    /// runs the backend's abort hook once, then fails every pending work.
    /// Later submissions fail at once with the first cause. Returns how many
    /// works were failed.
    ///
    /// Safe to call from the backend itself (the hook runs with no lock
    /// held, and a second abort does not run it again).
    pub fn abort(&self, cause: &WorkError) -> usize {
        // Claim the first abort under the same lock as the check, so two
        // concurrent aborts cannot both run the hooks.
        if let Some(hook) = self.claim(cause) {
            Self::first_error(hook, cause);
            tracing::warn!(error = %cause, "aborting group");
            if let Some(hook) = lock(&self.abort_hook).as_ref() {
                hook(cause);
            }
        }
        self.fail_all(cause)
    }

    /// The pending ops whose deadline is before `now`, oldest first: their
    /// registry ids (for [`fail_one`](Self::fail_one)), contexts and timeouts
    /// (deadline minus submission time).
    ///
    /// An expired op with a [`FinishedProbe`] that finds it finished is not
    /// reported: it is retired from the registry and its flight record
    /// marked completed (its work completes when polled or dropped; nothing
    /// is failed).
    pub fn expired(&self, now: Instant) -> Vec<(u64, OpContext, std::time::Duration)> {
        self.expired_and_next(now).0
    }

    /// [`expired`](Self::expired), and the earliest deadline after `now`
    /// of an op still pending (one look at the entries for both).
    pub fn expired_and_next(
        &self,
        now: Instant,
    ) -> (Vec<(u64, OpContext, std::time::Duration)>, Option<Instant>) {
        let mut inner = lock(&self.inner);
        let mut out = Vec::new();
        let mut retired = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, e) in inner.entries.iter() {
            match e.deadline {
                Some(d) if d > now => next = Some(next.map_or(d, |n| n.min(d))),
                Some(d) if d <= now => {
                    if e.probe.as_ref().is_some_and(|p| p.finished()) {
                        retired.push(id);
                    } else {
                        out.push((
                            id,
                            e.fail.context().clone(),
                            d.saturating_duration_since(e.submitted),
                        ));
                    }
                }
                _ => {}
            }
        }
        for id in retired {
            if let Some(e) = inner.entries.remove(id) {
                tracing::debug!(op = %e.fail.context(), "past its deadline but finished: retired, not timed out");
                if let (Some(r), Some(rec)) = (&self.recorder, e.rec) {
                    r.finished_range(rec, u64::from(e.ops), None);
                }
            }
        }
        (out, next)
    }

    /// Fails one pending op (by registry id) with `err`, if it is still
    /// pending.
    pub fn fail_one(&self, id: u64, err: WorkError) -> bool {
        let entry = lock(&self.inner).entries.remove(id);
        match entry {
            Some(e) => {
                self.record_failed(&e, &err);
                e.fail.fail(err);
                true
            }
            None => false,
        }
    }

    /// Slots of the ring (entries and finished gaps), for tests.
    #[cfg(test)]
    pub(crate) fn ring_len(&self) -> usize {
        lock(&self.inner).entries.slots.len()
    }

    /// Number of pending ops (each op of a batch counts).
    pub fn pending(&self) -> usize {
        lock(&self.inner).entries.ops()
    }

    /// Contexts of all pending ops, in submission order.
    pub fn pending_ops(&self) -> Vec<OpContext> {
        let mut out = Vec::new();
        for (_, e) in lock(&self.inner).entries.iter() {
            e.fail.contexts(&mut out);
        }
        out
    }
}

/// A batch being entered ([`Registry::begin_batch`]): holds the registry's
/// lock, and the recorder's, until [`Registry::commit_batch`].
pub(crate) struct BatchInsert<'r> {
    inner: MutexGuard<'r, Inner>,
    appender: Option<Appender<'r>>,
    /// The submission time as wall-clock microseconds, for every record.
    at_us: u64,
    /// The entry's id, taken at commit.
    id: u64,
    first_rec: Option<u64>,
    /// Every op recorded, in order.
    ops: Vec<OpContext>,
    members: Vec<DynArc<dyn Fail>>,
}

impl BatchInsert<'_> {
    /// The registry id the batch's entry gets.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Enters op `ctx` of the batch, started at the batch's submission
    /// time, and records it; its flight-record id, if the registry records.
    pub(crate) fn record(&mut self, ctx: OpContext, collective: bool, meta: OpMeta) -> Option<u64> {
        let at = self.at_us;
        let rec = self
            .appender
            .as_mut()
            .map(|a| a.started(ctx.seq, ctx.op, collective, meta, at));
        self.ops.push(ctx);
        if self.first_rec.is_none() {
            self.first_rec = rec;
        }
        rec
    }

    /// Adds a member's handle, failed with the entry.
    pub(crate) fn member(&mut self, m: DynArc<dyn Fail>) {
        self.members.push(m);
    }
}
