//! The watchdog and heartbeat threads, started with the first group
//! watched, and the flight-recorder dumps they (and a failing group, and
//! SIGUSR1) write.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::flight_recorder::{Dump, GroupDump};
use chorus_core::Registry;
use chorus_core::{OpContext, WorkError};

use super::alarm::Alarm;
use super::config::{ErrorPolicy, WatchdogConfig};
use super::policy::apply;
use super::state::{State, PENDING_CONFIG, STATE};
use super::watched::{AsyncErrorCheck, WatchedGroup};
use chorus_core::sync::lock;

/// The watchdog of this process, made (and its threads started, unless it
/// is switched off) on first use.
fn state() -> &'static Arc<State> {
    STATE.get_or_init(|| {
        let config = lock(&PENDING_CONFIG)
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
/// [`WatchdogConfig::enabled`] false). Groups are watched when they are
/// built; tests reach it through `chorus::test_util` (feature `test-util`).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
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
    lock(&st.groups).push(group);
}

/// Whether the watchdog runs (false when switched off by `CHORUS_WATCHDOG=0`
/// or [`WatchdogConfig::enabled`]). Starts it if it has not started yet.
pub fn enabled() -> bool {
    state().config.enabled
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
    let _one = lock(&DUMPING);
    let st = state();
    let mut groups = BTreeMap::new();
    for g in lock(&st.groups).iter() {
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
#[cfg(feature = "test-util")]
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
        let mut groups = lock(&st.groups);
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
