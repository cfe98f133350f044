//! The heartbeat monitor notices a watchdog stuck inside a backend's
//! asynchronous-error check (as a hung driver call would leave it), dumps
//! the flight recorder and applies each group's error policy.
//!
//! The watchdog is a process-wide singleton configured once: this file is
//! its own test process, and exactly one test in it configures the
//! watchdog in-process; the `AbortProcess` case runs in a child process
//! (this test binary re-run on the `child_*` test, which does nothing
//! unless the parent's environment variable is set).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use chorus::test_util::{watch, AsyncErrorCheck, WatchedGroup};
use chorus::watchdog::{self, ErrorPolicy, WatchdogConfig};
use chorus_core::flight_recorder::{Dump, FlightRecorder, OpMeta};
use chorus_core::sync::lock;
use chorus_core::{OpContext, OpFuture, Registry, WorkError};

/// Bound on every wait: reaching it is a failure, not a measurement.
const BOUND: Duration = Duration::from_secs(30);
const HEARTBEAT: Duration = Duration::from_millis(400);
const CHILD_ENV: &str = "CHORUS_TEST_HEARTBEAT_CHILD_DIR";

/// A gate the stuck check waits on until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    entered: AtomicBool,
}

impl Gate {
    fn block(&self) {
        self.entered.store(true, Ordering::SeqCst);
        let mut open = lock(&self.open);
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn open(&self) {
        *lock(&self.open) = true;
        self.cv.notify_all();
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("chorus-heartbeat-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn configure(dir: &Path) {
    assert!(
        watchdog::configure(WatchdogConfig {
            interval: Duration::from_millis(5),
            heartbeat_timeout: HEARTBEAT,
            dump_dir: dir.to_path_buf(),
            dump_on_sigusr1: false,
            enabled: true,
        }),
        "the watchdog must not have started before this test"
    );
}

fn ctx(group: &str, seq: u64, op: &'static str) -> OpContext {
    OpContext {
        rank: 0,
        group: group.into(),
        seq,
        op,
        internal: None,
    }
}

/// A recorded group with one completed op (seq 1) and one pending op
/// (seq 2, no deadline: only the heartbeat monitor can fail it).
fn group(name: &str) -> (Arc<Registry>, OpFuture<u32>, chorus_core::Completer<u32>) {
    let reg = Arc::new(Registry::with_recorder(Arc::new(FlightRecorder::new(16))));
    let meta = || OpMeta {
        dtype: Some("f32".into()),
        count: 10,
        peer: None,
        internal: None,
    };
    let (w, c) = OpFuture::new_recorded(ctx(name, 1, "all_reduce"), &reg, None, true, meta())
        .expect("register");
    c.complete(Ok(1));
    assert_eq!(w.wait_timeout(BOUND).expect("completed"), 1);
    let (w, c) = OpFuture::new_recorded(ctx(name, 2, "broadcast"), &reg, None, true, meta())
        .expect("register");
    (reg, w, c)
}

fn stuck_check(gate: &Arc<Gate>) -> AsyncErrorCheck {
    let gate = gate.clone();
    Arc::new(move || {
        gate.block();
        None
    })
}

fn read_dump(dir: &Path) -> Dump {
    let path = dir.join(Dump::file_name(0));
    let json = std::fs::read(&path).unwrap_or_else(|e| panic!("no dump at {path:?}: {e}"));
    serde_json::from_slice(&json).expect("a valid dump")
}

fn assert_heartbeat_error(err: &WorkError, group: &str) {
    assert_eq!(err.kind(), "HeartbeatTimeout", "{err}");
    let WorkError::HeartbeatTimeout { ctx, after } = err else {
        unreachable!()
    };
    assert!(*after >= HEARTBEAT, "{after:?}");
    assert_eq!(
        (&*ctx.group, ctx.seq, ctx.op),
        (group, 2, "broadcast"),
        "re-addressed to the pending op"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("heartbeat timeout: the chorus watchdog made no progress"),
        "{msg}"
    );
    assert!(msg.contains("flight recorder was dumped"), "{msg}");
    assert!(
        !msg.contains("op timed out"),
        "distinct from an op timeout: {msg}"
    );
}

#[test]
fn a_watchdog_stuck_in_a_check_is_noticed_by_the_heartbeat_monitor() {
    let dir = temp_dir("inproc");
    configure(&dir);
    let gate = Arc::new(Gate::default());
    // "world" (AbortGroup) has the stuck check; "side" (FailWorks) has none
    // but is failed too: nothing of the process can be trusted to finish.
    let (world, w_world, _c_world) = group("world");
    let hook_ran = Arc::new(AtomicBool::new(false));
    let ran = hook_ran.clone();
    world.set_abort_hook(move |_| ran.store(true, Ordering::SeqCst));
    let (side, w_side, _c_side) = group("side");
    watch(WatchedGroup {
        name: "world".into(),
        rank: 0,
        size: 2,
        registry: Arc::downgrade(&world),
        policy: ErrorPolicy::AbortGroup,
        check: Some(stuck_check(&gate)),
    });
    watch(WatchedGroup {
        name: "side".into(),
        rank: 0,
        size: 2,
        registry: Arc::downgrade(&side),
        policy: ErrorPolicy::FailWorks,
        check: None,
    });

    let err = w_world.wait_timeout(BOUND).expect_err("must fail").error;
    assert_heartbeat_error(&err, "world");
    let err = w_side.wait_timeout(BOUND).expect_err("must fail").error;
    assert_heartbeat_error(&err, "side");
    assert!(gate.entered.load(Ordering::SeqCst));

    // The policy: both groups are failed, later calls refused with the
    // cause; the backend's abort (which may be what is stuck) is not called.
    for (reg, name) in [(&world, "world"), (&side, "side")] {
        assert_eq!(reg.errored().map(|e| e.kind()), Some("HeartbeatTimeout"));
        match OpFuture::<u32>::new(ctx(name, 3, "all_reduce"), reg, None) {
            Err(WorkError::GroupErrored { cause, .. }) => {
                assert_eq!(cause.kind(), "HeartbeatTimeout")
            }
            other => panic!("expected GroupErrored, got {other:?}"),
        }
    }
    assert!(!hook_ran.load(Ordering::SeqCst));

    // The dump: written by the monitor, with both groups' ops.
    let dump = read_dump(&dir);
    assert_eq!(dump.reason, "heartbeat timeout");
    for name in ["world", "side"] {
        let ops = &dump.groups[name].ops;
        let seqs: Vec<(u64, &str)> = ops.iter().map(|o| (o.seq, &*o.op)).collect();
        assert_eq!(seqs, [(1, "all_reduce"), (2, "broadcast")], "{name}");
        // Seq 2 was still pending when the monitor dumped.
        assert!(ops[0].completed_us.is_some() && ops[1].completed_us.is_none());
    }

    // Released, the watchdog goes on.
    let rounds = watchdog::stats().rounds;
    gate.open();
    let start = std::time::Instant::now();
    while watchdog::stats().rounds <= rounds {
        assert!(start.elapsed() < BOUND, "the watchdog did not resume");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs in the child process only: a group under `AbortProcess` whose
/// check is stuck; the heartbeat monitor dumps and aborts the process.
#[test]
fn child_abort_process_on_heartbeat_timeout() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    configure(&dir);
    let gate = Arc::new(Gate::default());
    let (world, w, _c) = group("world");
    watch(WatchedGroup {
        name: "world".into(),
        rank: 0,
        size: 2,
        registry: Arc::downgrade(&world),
        policy: ErrorPolicy::AbortProcess,
        check: Some(stuck_check(&gate)),
    });
    let r = w.wait_timeout(BOUND);
    // Reached only if the process was not aborted.
    println!("CHILD SURVIVED: {r:?}");
}

#[test]
fn abort_process_policy_aborts_the_process_on_heartbeat_timeout() {
    use std::os::unix::process::ExitStatusExt;
    let dir = temp_dir("child");
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_abort_process_on_heartbeat_timeout",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("chorus: aborting the process") && stderr.contains("heartbeat timeout"),
        "{stderr}"
    );
    let dump = read_dump(&dir);
    assert_eq!(dump.reason, "heartbeat timeout");
    assert_eq!(dump.groups["world"].ops.len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
