//! Fakes shared by the models.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use chorus_core::comm_cache::{CommCache, CommFactory, CommKey};
use chorus_core::sync::lock;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;

/// Preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set, so a bare
/// `cargo test` under `--cfg loom` still ends in reasonable time.
pub const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom with the preemption bound from
/// `LOOM_MAX_PREEMPTIONS` (default [`DEFAULT_PREEMPTIONS`]), and prints how
/// many interleavings it explored (shown with `--nocapture`).
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    model_capped(usize::MAX, f);
}

/// Like [`model`], with the preemption bound capped at `cap`: for the
/// largest models, whose state space grows too fast past that bound to fit
/// the suite's time budget.
pub fn model_capped<F>(cap: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut b = loom::model::Builder::new();
    let bound = b.preemption_bound.unwrap_or(DEFAULT_PREEMPTIONS).min(cap);
    b.preemption_bound = Some(bound);
    let bound = b.preemption_bound;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let start = std::time::Instant::now();
    b.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    println!(
        "loom: {} interleavings in {:.2?} (max preemptions {:?})",
        runs.load(std::sync::atomic::Ordering::Relaxed),
        start.elapsed(),
        bound
    );
}

/// The fake factory's communicator: remembers its store key and counts its
/// drops in `drops`.
pub struct FakeComm {
    /// The store key it was created under.
    pub store_key: String,
    drops: Arc<AtomicUsize>,
}

impl fmt::Debug for FakeComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeComm")
            .field("store_key", &self.store_key)
            .finish()
    }
}

impl Drop for FakeComm {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// The fake factory's error: the store key of the failed initialization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeError(pub String);

impl fmt::Display for FakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fake init under '{}' failed", self.0)
    }
}

/// A factory that records the store keys it is given, fails its first
/// `fail_first` initializations, and (with `yields`) has each
/// initialization return `Pending` once before finishing, so the models go
/// through the parked state of the in-initialization entry.
pub struct Fake {
    /// Store keys given to `create`, in call order. A std mutex: recording is
    /// not part of what the models check, and keeps the state space small.
    calls: std::sync::Mutex<Vec<String>>,
    fail_left: AtomicUsize,
    yields: bool,
    /// Drops of communicators made by this factory.
    pub comm_drops: Arc<AtomicUsize>,
}

impl fmt::Debug for Fake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fake")
            .field("yields", &self.yields)
            .finish()
    }
}

impl Fake {
    /// A factory that fails its first `fail_first` initializations.
    pub fn new(fail_first: usize, yields: bool) -> Self {
        Fake {
            calls: std::sync::Mutex::new(Vec::new()),
            fail_left: AtomicUsize::new(fail_first),
            yields,
            comm_drops: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The store keys `create` was called with, in call order.
    pub fn store_keys(&self) -> Vec<String> {
        match self.calls.lock() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// The fake factory's initialization future.
pub struct FakeInit {
    yield_first: bool,
    result: Option<Result<FakeComm, FakeError>>,
}

impl fmt::Debug for FakeInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeInit").finish_non_exhaustive()
    }
}

impl Future for FakeInit {
    type Output = Result<FakeComm, FakeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.yield_first {
            self.yield_first = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match self.result.take() {
            Some(r) => Poll::Ready(r),
            None => Poll::Ready(Err(FakeError("polled after completion".into()))),
        }
    }
}

impl CommFactory for Fake {
    type Comm = FakeComm;
    type Error = FakeError;
    type Init = FakeInit;

    fn create(&self, _key: &CommKey, store_key: String) -> FakeInit {
        match self.calls.lock() {
            Ok(mut c) => c.push(store_key.clone()),
            Err(p) => p.into_inner().push(store_key.clone()),
        }
        let fail = self
            .fail_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let result = if fail {
            Err(FakeError(store_key))
        } else {
            Ok(FakeComm {
                store_key,
                drops: self.comm_drops.clone(),
            })
        };
        FakeInit {
            yield_first: self.yields,
            result: Some(result),
        }
    }
}

/// A cache over a [`Fake`] factory.
pub type FakeCache = CommCache<Fake>;

/// A stand-in for an op's buffers: counts its drops, and checks that it is
/// never dropped while the backend still has it in flight.
pub struct Tracked {
    drops: Arc<AtomicUsize>,
    in_flight: Arc<AtomicBool>,
}

impl fmt::Debug for Tracked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tracked")
    }
}

impl Tracked {
    /// A buffer counted in `drops`, in flight while `in_flight` is set.
    pub fn new(drops: &Arc<AtomicUsize>, in_flight: &Arc<AtomicBool>) -> Self {
        Tracked {
            drops: drops.clone(),
            in_flight: in_flight.clone(),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        assert!(
            !self.in_flight.load(Ordering::SeqCst),
            "buffer released while the backend still had it in flight"
        );
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `f` once, inside loom's executor.
pub fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    loom::future::block_on(std::future::poll_fn(|cx| {
        Poll::Ready(Pin::new(&mut *f).poll(cx))
    }))
}

/// What the single-flight model needs of a communicator cache: a first use
/// that joins or starts the one initialization of its key, and how many
/// initializations were started. The production cache and the known-bad
/// one below both implement it, so the same model runs against both.
pub trait SingleFlight: Send + Sync + 'static {
    /// The communicator of `key`, created on first use (waits for it).
    ///
    /// # Errors
    ///
    /// The initialization's error, as text.
    fn get_comm(&self, key: CommKey) -> Result<Arc<FakeComm>, String>;
    /// Initializations started so far.
    fn created(&self) -> u64;
}

impl SingleFlight for FakeCache {
    fn get_comm(&self, key: CommKey) -> Result<Arc<FakeComm>, String> {
        loom::future::block_on(self.get(key)).map_err(|e| e.to_string())
    }

    fn created(&self) -> u64 {
        CommCache::created(self)
    }
}

/// A deliberately broken cache, for the suite to show that it can fail:
/// it looks the key up under its lock, lets go of the lock, creates the
/// communicator, and inserts it under a second hold of the lock without
/// looking again, so two concurrent first uses can both create one.
pub struct CheckThenInsert {
    map: loom::sync::Mutex<Vec<(CommKey, Arc<FakeComm>)>>,
    factory: Fake,
    created: loom::sync::atomic::AtomicU64,
}

impl fmt::Debug for CheckThenInsert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckThenInsert").finish_non_exhaustive()
    }
}

impl CheckThenInsert {
    /// An empty cache over `factory`.
    pub fn new(factory: Fake) -> Self {
        CheckThenInsert {
            map: loom::sync::Mutex::new(Vec::new()),
            factory,
            created: loom::sync::atomic::AtomicU64::new(0),
        }
    }

    fn cached(&self, key: &CommKey) -> Option<Arc<FakeComm>> {
        let map = lock(&self.map);
        map.iter().find(|(k, _)| k == key).map(|(_, c)| c.clone())
    }
}

impl SingleFlight for CheckThenInsert {
    fn get_comm(&self, key: CommKey) -> Result<Arc<FakeComm>, String> {
        if let Some(c) = self.cached(&key) {
            return Ok(c);
        }
        // BUG (deliberate): nothing holds the key between the look-up above
        // and the insert below.
        let n = self.created.fetch_add(1, Ordering::SeqCst);
        let init = self.factory.create(&key, format!("comm/{n}"));
        let comm = Arc::new(loom::future::block_on(init).map_err(|e| e.to_string())?);
        let mut map = lock(&self.map);
        if let Some((_, c)) = map.iter().find(|(k, _)| *k == key) {
            return Ok(c.clone());
        }
        map.push((key, comm.clone()));
        Ok(comm)
    }

    fn created(&self) -> u64 {
        self.created.load(Ordering::SeqCst)
    }
}

/// The single-flight property, for any cache: `callers` concurrent first
/// uses of one key start exactly one initialization, and every caller gets
/// the same communicator.
pub fn single_flight_holds<C: SingleFlight>(cache: C, callers: usize) {
    let cache = Arc::new(cache);
    let key = CommKey::devices([0, 1]);
    let handles: Vec<_> = (1..callers)
        .map(|_| {
            let cache = cache.clone();
            let key = key.clone();
            loom::thread::spawn(move || cache.get_comm(key).expect("init succeeds"))
        })
        .collect();
    let mine = cache.get_comm(key).expect("init succeeds");
    for h in handles {
        let theirs = h.join().expect("caller thread");
        assert!(
            Arc::ptr_eq(&mine, &theirs),
            "every caller gets the same communicator"
        );
    }
    assert_eq!(cache.created(), 1, "exactly one initialization");
}
