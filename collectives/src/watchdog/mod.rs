//! The watchdog: one thread per process that watches every group's in-flight
//! ops for timeouts and every communicator for asynchronous errors, applies
//! the group's error policy, and dumps the flight recorder. A second thread,
//! the heartbeat monitor, notices a watchdog that stopped making progress
//! (stuck in a driver call) and acts in its place.
//!
//! # When it wakes
//!
//! The watchdog fails each op at its deadline, not on a beat: it sleeps
//! until the earliest deadline pending, and every group's registry tells
//! it each new op's deadline as the op is entered, so one earlier than the
//! thread's next wake-up brings that wake-up forward (`alarm`). The
//! backends' asynchronous-error checks run every
//! [`WatchdogConfig::interval`]. A job whose ops end in time wakes the
//! thread once per interval, whatever its rate of ops.
//!
//! Both threads are chorus's own: a blocked user executor cannot stop error
//! detection.
//!
//! # Heartbeat monitor
//!
//! The watchdog counts its rounds (the heartbeat, [`stats`]`().rounds`). The
//! monitor wakes every quarter of [`WatchdogConfig::heartbeat_timeout`]; when
//! the count has not moved for that long (the watchdog is stuck, typically
//! inside a backend's [`AsyncErrorCheck`] such as `ncclCommGetAsyncError` in
//! a hung driver), it acts once per stall: it dumps every group's flight
//! recorder (reason `"heartbeat timeout"`), logs at error level with the
//! dump's path, and fails every watched group's pending works with
//! [`WorkError::HeartbeatTimeout`] (its own kind and message, distinct from
//! an op timeout and from a store timeout). Under [`ErrorPolicy::AbortGroup`]
//! and [`ErrorPolicy::FailWorks`] the groups are marked failed without
//! calling the backends' abort (which may be what is stuck);
//! [`ErrorPolicy::AbortProcess`] aborts the process. The monitor does not
//! call into the backends at all. Once the watchdog moves again, the
//! monitor re-arms. `collectives/tests/watchdog_heartbeat.rs` checks this with
//! a check that blocks.
//!
//! # Error propagation
//!
//! A group's first error can also be published to its peers through the
//! store, so that they fail fast with [`WorkError::Remote`] instead of each
//! waiting out its own timeout: opt-in per group, see
//! [`crate::propagation`]. The watchdog applies the group's policy to a
//! peer's failure as to a local one.
//!
//! Settings ([`WatchdogConfig`]) come from [`configure`] (before the first
//! group is watched), or else from the environment
//! ([`WatchdogConfig::from_env`]: `CHORUS_WATCHDOG_INTERVAL_MS`,
//! `CHORUS_HEARTBEAT_TIMEOUT_S`, `CHORUS_TRACE_DIR`, `CHORUS_DUMP_ON_SIGUSR1`,
//! `CHORUS_WATCHDOG`; docs/CONFIG.md). With the watchdog switched off
//! ([`WatchdogConfig::enabled`]), [`watch`] registers nothing and no thread
//! is started, so ops time out only through blocking waits such as
//! `wait_timeout`: meant for measuring the watchdog's overhead, not for
//! production.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use chorus_core::flight_recorder::{Dump, GroupDump};
use chorus_core::Registry;
use chorus_core::{OpContext, WorkError};

mod alarm;

use alarm::Alarm;

/// What a group does when one of its ops times out or its backend reports an
/// error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Abort the group's backend (close connections, abort communicators)
    /// and fail every pending work; later calls fail at once. The default.
    #[default]
    AbortGroup,
    /// Fail only the works that timed out; leave the backend alone.
    FailWorks,
    /// Dump the flight recorder and abort the process.
    AbortProcess,
}

/// Watchdog settings.
#[derive(Clone, Debug)]
pub struct WatchdogConfig {
    /// How often the watchdog polls the backends' asynchronous errors
    /// (their detection latency is at most about this, plus the time a
    /// backend's error check takes). Timeouts do not wait for it: the
    /// watchdog wakes at each op's deadline.
    pub interval: Duration,
    /// How long the watchdog may make no progress before the heartbeat
    /// monitor acts.
    pub heartbeat_timeout: Duration,
    /// Where flight-recorder dumps are written.
    pub dump_dir: PathBuf,
    /// Dump every group's recorder when the process receives SIGUSR1.
    pub dump_on_sigusr1: bool,
    /// Whether the watchdog runs at all (`CHORUS_WATCHDOG=0` turns it off:
    /// no thread, no group watched, no timeout or async-error detection).
    pub enabled: bool,
}

impl Default for WatchdogConfig {
    /// Error checks every 100 ms (as PyTorch's watchdog), a 60 s heartbeat
    /// timeout, dumps into the system temp folder, a dump on SIGUSR1, the
    /// watchdog on.
    fn default() -> Self {
        WatchdogConfig {
            interval: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_secs(60),
            dump_dir: std::env::temp_dir(),
            dump_on_sigusr1: true,
            enabled: true,
        }
    }
}

/// A backend's asynchronous error check (NCCL: `ncclCommGetAsyncError` on
/// each communicator). Returns the error text if the backend has failed.
pub type AsyncErrorCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// A group the watchdog watches.
pub struct WatchedGroup {
    /// Group name.
    pub name: Arc<str>,
    /// This process's rank in the group.
    pub rank: usize,
    /// Number of ranks in the group.
    pub size: usize,
    /// The group's registry; the watchdog forgets the group once it is gone.
    pub registry: Weak<Registry>,
    /// What to do on timeout or error.
    pub policy: ErrorPolicy,
    /// The backend's asynchronous error check, if it has one.
    pub check: Option<AsyncErrorCheck>,
}

impl std::fmt::Debug for WatchedGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedGroup")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("policy", &self.policy)
            .finish()
    }
}

struct State {
    config: WatchdogConfig,
    groups: Mutex<Vec<WatchedGroup>>,
    /// Incremented by the watchdog on every round.
    heartbeat: AtomicU64,
    /// Global rank used to name this process's dump.
    process_rank: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    /// Rounds are skipped while set (benchmarks' in-process A/B only).
    paused: std::sync::atomic::AtomicBool,
    /// The watchdog thread's next wake-up, brought forward by deadlines.
    alarm: Alarm,
}

static STATE: OnceLock<Arc<State>> = OnceLock::new();
static PENDING_CONFIG: Mutex<Option<WatchdogConfig>> = Mutex::new(None);

/// Sets the watchdog's settings. Takes effect only before the first group is
/// watched; returns false if the watchdog already runs.
pub fn configure(config: WatchdogConfig) -> bool {
    if STATE.get().is_some() {
        return false;
    }
    *PENDING_CONFIG.lock().unwrap_or_else(|p| p.into_inner()) = Some(config);
    true
}

fn state() -> &'static Arc<State> {
    STATE.get_or_init(|| {
        let config = PENDING_CONFIG
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(WatchdogConfig::from_env);
        let st = Arc::new(State {
            config,
            groups: Mutex::new(Vec::new()),
            heartbeat: AtomicU64::new(0),
            process_rank: AtomicU64::new(u64::MAX),
            timeouts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            paused: std::sync::atomic::AtomicBool::new(false),
            alarm: Alarm::new(),
        });
        if st.config.enabled {
            start_threads(&st);
        } else {
            tracing::warn!("CHORUS_WATCHDOG=0: the chorus watchdog is off; ops time out only in blocking waits");
        }
        st
    })
}

fn start_threads(st: &Arc<State>) {
    let w = st.clone();
    let spawned = std::thread::Builder::new()
        .name("chorus-watchdog".into())
        .spawn(move || watchdog_loop(&w));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the chorus watchdog thread; timeouts rely on the backends alone");
    }
    let h = st.clone();
    let spawned = std::thread::Builder::new()
        .name("chorus-heartbeat".into())
        .spawn(move || heartbeat_loop(&h));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the chorus heartbeat monitor");
    }
    if st.config.dump_on_sigusr1 {
        install_sigusr1();
    }
}

#[cfg(unix)]
fn install_sigusr1() {
    let Ok(handle) = chorus_store::rt::handle() else {
        return;
    };
    handle.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut sig) = signal(SignalKind::user_defined1()) else {
            tracing::warn!("cannot install the SIGUSR1 handler; dumps on SIGUSR1 are off");
            return;
        };
        while sig.recv().await.is_some() {
            match dump_all("SIGUSR1") {
                Ok(p) => tracing::warn!(path = %p.display(), "flight recorder dumped on SIGUSR1"),
                Err(e) => tracing::error!(error = %e, "flight recorder dump on SIGUSR1 failed"),
            }
        }
    });
}

#[cfg(not(unix))]
fn install_sigusr1() {}

/// Starts watching `group` (starting the watchdog on first use). Does
/// nothing when the watchdog is switched off (`CHORUS_WATCHDOG=0` or
/// [`WatchdogConfig::enabled`] false).
pub fn watch(group: WatchedGroup) {
    let st = state();
    if !st.config.enabled {
        return;
    }
    // The world group names the process's dump; otherwise the first group.
    if &*group.name == "world" || st.process_rank.load(Ordering::Relaxed) == u64::MAX {
        st.process_rank.store(group.rank as u64, Ordering::Relaxed);
    }
    // Each op's deadline, as it is entered, may bring the next round
    // forward; ops entered before are seen by that round's scan.
    if let Some(reg) = group.registry.upgrade() {
        let st = st.clone();
        reg.set_deadline_hook(move |d| st.alarm.ring_by(d));
    }
    st.groups
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(group);
}

/// Counters of what the watchdog has done in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogStats {
    /// Rounds completed (the heartbeat).
    pub rounds: u64,
    /// Ops failed for timeout.
    pub timeouts: u64,
    /// Backend errors acted on.
    pub errors: u64,
}

/// Whether the watchdog runs (false when switched off by `CHORUS_WATCHDOG=0`
/// or [`WatchdogConfig::enabled`]). Starts it if it has not started yet.
pub fn enabled() -> bool {
    state().config.enabled
}

/// What the watchdog has done so far (zeros if it never started).
pub fn stats() -> WatchdogStats {
    STATE
        .get()
        .map_or_else(WatchdogStats::default, |st| WatchdogStats {
            rounds: st.heartbeat.load(Ordering::Relaxed),
            timeouts: st.timeouts.load(Ordering::Relaxed),
            errors: st.errors.load(Ordering::Relaxed),
        })
}

/// Writes every watched group's flight recorder into one JSON file for this
/// process, in the dump folder, and returns its path.
///
/// # Errors
///
/// The I/O or serialization error.
pub fn dump_all(reason: &str) -> std::io::Result<PathBuf> {
    // One dump at a time: the watchdog, an erroring group and SIGUSR1 may
    // all ask at once, and they write the same file.
    static DUMPING: Mutex<()> = Mutex::new(());
    let _one = DUMPING.lock().unwrap_or_else(|p| p.into_inner());
    let st = state();
    let mut groups = BTreeMap::new();
    for g in st.groups.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        if let Some(reg) = g.registry.upgrade() {
            if let Some(rec) = reg.recorder() {
                groups.insert(
                    g.name.to_string(),
                    GroupDump {
                        rank: g.rank,
                        size: g.size,
                        ops: rec.snapshot(),
                    },
                );
            }
        }
    }
    let rank = match st.process_rank.load(Ordering::Relaxed) {
        u64::MAX => 0,
        r => r as usize,
    };
    let dump = Dump::new(rank, reason, groups);
    std::fs::create_dir_all(&st.config.dump_dir)?;
    let path = st.config.dump_dir.join(Dump::file_name(rank));
    let json = serde_json::to_vec_pretty(&dump).map_err(std::io::Error::other)?;
    // Write then rename, so a reader never sees half a dump.
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Called when a group fails (first error only): dumps the flight recorder
/// if the watchdog runs in this process, and logs the path.
pub(crate) fn on_group_error(cause: &WorkError) {
    if STATE.get().is_none() {
        return;
    }
    let path = dump_logged("error");
    tracing::error!(error = %cause, dump = %path, "group failed; flight recorder dumped");
}

/// Skips the watchdog's rounds while `paused` (its thread keeps waking and
/// beating, so the heartbeat monitor stays quiet). For benchmarks that
/// compare the cost of the rounds within one process; never pause it in a
/// job: timeouts and NCCL errors go unnoticed meanwhile.
#[doc(hidden)]
pub fn set_paused(paused: bool) {
    state().paused.store(paused, Ordering::Relaxed);
}

/// Applies `policy` to a group whose failure another rank reported through
/// the store (error propagation): dumps the flight recorder (if the
/// watchdog runs in this process) and fails the group as for a local error.
pub(crate) fn apply_remote(policy: ErrorPolicy, reg: &Registry, err: &WorkError) {
    apply_detected(policy, reg, err, "remote error");
}

/// Applies `policy` to a group whose failure was found outside its
/// backends (a peer's report, a silent peer): dumps the flight recorder
/// (if the watchdog runs in this process) with `reason` and fails the
/// group as for a local error.
pub(crate) fn apply_detected(policy: ErrorPolicy, reg: &Registry, err: &WorkError, reason: &str) {
    // AbortGroup dumps through `on_group_error`; the others dump here.
    if policy != ErrorPolicy::AbortGroup && STATE.get().is_some() {
        let path = dump_logged(reason);
        tracing::error!(error = %err, dump = %path, ?policy, "{reason}: flight recorder dumped");
    }
    apply(policy, reg, err, &[]);
}

fn dump_logged(reason: &str) -> String {
    match dump_all(reason) {
        Ok(p) => p.display().to_string(),
        Err(e) => format!("(dump failed: {e})"),
    }
}

/// The shortest sleep after a round that left a deadline already past (an
/// op timed out while its group was being failed by another thread): the
/// next round looks again without spinning.
const MIN_NAP: Duration = Duration::from_millis(1);

/// Rounds: the asynchronous-error checks every [`WatchdogConfig::interval`],
/// and a look at the deadlines whenever the earliest pending one comes
/// (the [`Alarm`] brings the wake-up forward when an op with an earlier
/// deadline is entered), and at least every quarter of the heartbeat
/// timeout, so that the heartbeat keeps moving.
fn watchdog_loop(st: &Arc<State>) {
    st.alarm.attach();
    let interval = st.config.interval;
    let most = (st.config.heartbeat_timeout / 4).max(MIN_NAP);
    let mut checks_due = Instant::now() + interval;
    let mut wake = checks_due;
    loop {
        st.alarm.sleep_until(wake);
        let now = Instant::now();
        let checks = now >= checks_due;
        if checks {
            checks_due = now + interval;
        }
        // From here on, deadlines entered ring: the scan below may have
        // passed their registry.
        st.alarm.awake();
        let next = match st.paused.load(Ordering::Relaxed) {
            false => round(st, now, checks),
            true => None,
        };
        st.heartbeat.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        wake = checks_due.min(now + most);
        if let Some(d) = next {
            wake = wake.min(d.max(now + MIN_NAP));
        }
    }
}

/// One watchdog round over every group at `now`: the backends'
/// asynchronous-error checks if `checks`, then the ops past their
/// deadline. Returns the earliest deadline still pending.
fn round(st: &State, now: Instant, checks: bool) -> Option<Instant> {
    // Work on a snapshot of live registries, so that policy actions (which
    // may run backend abort hooks) happen without the group list locked.
    let mut live = Vec::new();
    {
        let mut groups = st.groups.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|g| g.registry.strong_count() > 0);
        for g in groups.iter() {
            if let Some(reg) = g.registry.upgrade() {
                live.push((reg, g.name.clone(), g.rank, g.policy, g.check.clone()));
            }
        }
    }
    let mut next: Option<Instant> = None;
    for (reg, name, rank, policy, check) in live {
        if reg.errored().is_some() {
            continue;
        }
        let after = group_round(st, &reg, &name, rank, policy, check.filter(|_| checks), now);
        if let Some(d) = after {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
    }
    next
}

/// One group's part of a round: its backend's asynchronous-error check
/// (if given), then its ops past their deadline. Returns the earliest
/// deadline still ahead (none once the group failed).
fn group_round(
    st: &State,
    reg: &Registry,
    name: &Arc<str>,
    rank: usize,
    policy: ErrorPolicy,
    check: Option<AsyncErrorCheck>,
    now: Instant,
) -> Option<Instant> {
    // Asynchronous backend errors first. The check runs with no lock
    // held: if it gets stuck, the heartbeat monitor can still act.
    if let Some(msg) = check.and_then(|check| check()) {
        st.errors.fetch_add(1, Ordering::Relaxed);
        let ctx = OpContext {
            rank,
            group: name.clone(),
            seq: 0,
            op: "watchdog",
            internal: None,
        };
        let err = WorkError::Backend { ctx, msg };
        let path = dump_logged("error");
        tracing::error!(group = %name, error = %err, dump = %path, "backend reported an asynchronous error");
        apply(policy, reg, &err, &[]);
        return None;
    }
    let (expired, next) = reg.expired_and_next(now);
    if expired.is_empty() {
        return next;
    }
    st.timeouts
        .fetch_add(expired.len() as u64, Ordering::Relaxed);
    let (_, ctx, after) = &expired[0];
    let err = WorkError::OpTimeout {
        ctx: ctx.clone(),
        after: *after,
    };
    let path = dump_logged("timeout");
    tracing::error!(group = %name, error = %err, dump = %path, ?policy, "op timed out");
    apply(policy, reg, &err, &expired);
    next
}

fn apply(
    policy: ErrorPolicy,
    reg: &Registry,
    err: &WorkError,
    expired: &[(u64, OpContext, Duration)],
) {
    match policy {
        ErrorPolicy::AbortGroup => {
            reg.abort(err);
        }
        ErrorPolicy::FailWorks => {
            if expired.is_empty() {
                reg.fail_all(err);
            }
            for (id, ctx, after) in expired {
                let e = match err {
                    WorkError::OpTimeout { .. } => WorkError::OpTimeout {
                        ctx: ctx.clone(),
                        after: *after,
                    },
                    other => other.for_op(ctx.clone()),
                };
                reg.fail_one(*id, e);
            }
        }
        ErrorPolicy::AbortProcess => {
            tracing::error!(error = %err, "error policy AbortProcess: aborting the process");
            eprintln!("chorus: aborting the process: {err}");
            std::process::abort();
        }
    }
}

fn heartbeat_loop(st: &Arc<State>) {
    let timeout = st.config.heartbeat_timeout;
    let step = (timeout / 4).max(Duration::from_millis(1));
    let mut last = st.heartbeat.load(Ordering::Relaxed);
    let mut since = Instant::now();
    let mut fired = false;
    loop {
        std::thread::sleep(step);
        let now = st.heartbeat.load(Ordering::Relaxed);
        if now != last {
            last = now;
            since = Instant::now();
            fired = false;
            continue;
        }
        if fired || since.elapsed() < timeout {
            continue;
        }
        fired = true;
        let after = since.elapsed();
        let path = dump_logged("heartbeat timeout");
        tracing::error!(?after, dump = %path, "heartbeat timeout: the chorus watchdog is stuck");
        // Act on every group without calling into the (possibly stuck)
        // backends' error checks. Only the lock on the group list is taken;
        // a watchdog stuck inside a check holds it, so use try_lock.
        let regs: Vec<(Arc<Registry>, Arc<str>, usize, ErrorPolicy)> = match st.groups.try_lock() {
            Ok(groups) => groups
                .iter()
                .filter_map(|g| {
                    g.registry
                        .upgrade()
                        .map(|r| (r, g.name.clone(), g.rank, g.policy))
                })
                .collect(),
            Err(_) => {
                tracing::error!("the watchdog holds the group list; cannot fail works from the heartbeat monitor");
                continue;
            }
        };
        for (reg, name, rank, policy) in regs {
            let ctx = OpContext {
                rank,
                group: name,
                seq: 0,
                op: "heartbeat",
                internal: None,
            };
            let err = WorkError::HeartbeatTimeout { ctx, after };
            match policy {
                // The backend's abort may be what is stuck: fail the works
                // without calling the abort hook.
                ErrorPolicy::AbortGroup | ErrorPolicy::FailWorks => {
                    reg.fail_all(&err);
                }
                ErrorPolicy::AbortProcess => apply(policy, &reg, &err, &[]),
            }
        }
    }
}
