use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Pending, Reactor, ReactorConfig};

struct Flag {
    done: Arc<AtomicBool>,
    tx: mpsc::Sender<u32>,
    id: u32,
    polls: Arc<AtomicU64>,
}

impl Pending for Flag {
    fn poll_complete(&mut self) -> bool {
        self.polls.fetch_add(1, Ordering::Relaxed);
        if self.done.load(Ordering::Acquire) {
            let _ = self.tx.send(self.id);
            true
        } else {
            false
        }
    }
}

#[test]
fn completes_entries_in_any_order_and_parks_when_idle() {
    let r = Reactor::new(ReactorConfig {
        spin: Duration::from_micros(50),
        yield_for: Duration::from_micros(100),
        max_sleep: Duration::from_micros(200),
        ..ReactorConfig::default()
    });
    let (tx, rx) = mpsc::channel();
    let polls = Arc::new(AtomicU64::new(0));
    let flags: Vec<Arc<AtomicBool>> = (0..8).map(|_| Arc::new(AtomicBool::new(false))).collect();
    for (i, f) in flags.iter().enumerate() {
        r.register(Box::new(Flag {
            done: f.clone(),
            tx: tx.clone(),
            id: i as u32,
            polls: polls.clone(),
        }))
        .map_err(|(e, _)| e)
        .unwrap();
    }
    // Complete them in a scrambled order; each must come out exactly once.
    let order = [5u32, 0, 7, 2, 1, 6, 3, 4];
    for &i in &order {
        flags[i as usize].store(true, Ordering::Release);
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("entry completed");
        assert_eq!(got, i);
    }
    assert_eq!(r.stats().registered, 8);
    // The completed counter moves right after the entry returns true.
    let t0 = Instant::now();
    while r.pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    assert_eq!(r.pending(), 0);
    // Idle: the thread parks and stops polling.
    while r.stats().parks == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(r.stats().parks >= 1, "idle reactor must park");
    let p = polls.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        polls.load(Ordering::Relaxed),
        p,
        "a parked reactor polls nothing"
    );
    // A new registration unparks it.
    let f = Arc::new(AtomicBool::new(true));
    r.register(Box::new(Flag {
        done: f,
        tx,
        id: 99,
        polls,
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 99);
}

#[test]
fn detached_entries_are_checked_slowly_and_wake_a_parked_thread() {
    let r = Reactor::new(ReactorConfig {
        spin: Duration::from_micros(50),
        yield_for: Duration::from_micros(100),
        max_sleep: Duration::from_micros(200),
        detached_poll: Duration::from_millis(5),
        ..ReactorConfig::default()
    });
    let (tx, rx) = mpsc::channel();
    let polls = Arc::new(AtomicU64::new(0));
    let flag = |id: u32, done: &Arc<AtomicBool>| {
        Box::new(Flag {
            done: done.clone(),
            tx: tx.clone(),
            id,
            polls: polls.clone(),
        })
    };
    // Start the thread and let it park with nothing to watch.
    let first = Arc::new(AtomicBool::new(true));
    r.register(flag(0, &first)).map_err(|(e, _)| e).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0);
    let t0 = Instant::now();
    while r.stats().parks == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(r.stats().parks >= 1);
    // A detached registration wakes the parked thread.
    let d = Arc::new(AtomicBool::new(false));
    r.register_detached(flag(1, &d))
        .map_err(|(e, _)| e)
        .unwrap();
    let t0 = Instant::now();
    while polls.load(Ordering::Relaxed) < 2 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    // Pending and detached: checked about once per 5 ms, not spun on.
    let p0 = polls.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    let checks = polls.load(Ordering::Relaxed) - p0;
    assert!(
        (2..=60).contains(&checks),
        "{checks} checks in 100 ms at a 5 ms period"
    );
    assert_eq!(r.pending(), 1);
    d.store(true, Ordering::Release);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    // An awaited entry registered meanwhile is not held back by the
    // detached period.
    let slow = Arc::new(AtomicBool::new(false));
    r.register_detached(flag(2, &slow))
        .map_err(|(e, _)| e)
        .unwrap();
    let fast = Arc::new(AtomicBool::new(false));
    r.register(flag(3, &fast)).map_err(|(e, _)| e).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    fast.store(true, Ordering::Release);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 3);
    slow.store(true, Ordering::Release);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 2);
    let t0 = Instant::now();
    while r.pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    assert_eq!(r.pending(), 0);
}

struct Ordered {
    pos: u64,
    done: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
    tx: mpsc::Sender<u64>,
}

impl Pending for Ordered {
    fn poll_complete(&mut self) -> bool {
        self.polls.fetch_add(1, Ordering::Relaxed);
        let d = self.done.load(Ordering::Acquire);
        if d {
            let _ = self.tx.send(self.pos);
        }
        d
    }
    fn order(&self) -> Option<(u64, u64)> {
        Some((7, self.pos))
    }
}

#[test]
fn ordered_queue_checks_the_oldest_only_and_never_loses_one() {
    let r = Reactor::new(ReactorConfig::default());
    let (tx, rx) = mpsc::channel();
    let mk = |pos: u64| {
        let done = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        (
            Ordered {
                pos,
                done: done.clone(),
                polls: polls.clone(),
                tx: tx.clone(),
            },
            done,
            polls,
        )
    };
    // Registered out of order: 2 first, then 1 (e.g. two submitting
    // threads); 3 last.
    let (e2, d2, p2) = mk(2);
    let (e1, d1, _p1) = mk(1);
    let (e3, d3, p3) = mk(3);
    for e in [e2, e1, e3] {
        r.register(Box::new(e)).map_err(|(e, _)| e).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    // 1 is pending, so 3 (after it) is never queried; 2, registered
    // ahead of 1, is still checked (never skipped on a later position).
    assert_eq!(
        p3.load(Ordering::Relaxed),
        0,
        "entries after a pending one are skipped"
    );
    assert!(p2.load(Ordering::Relaxed) >= 1);
    // Completing 1 lets the others be checked; none is lost.
    d1.store(true, Ordering::Release);
    d2.store(true, Ordering::Release);
    d3.store(true, Ordering::Release);
    let mut got: Vec<u64> = (0..3)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, vec![1, 2, 3]);
}

struct Panicky(Arc<AtomicU64>);
impl Pending for Panicky {
    fn poll_complete(&mut self) -> bool {
        panic!("entry bug")
    }
}
impl Drop for Panicky {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_panicking_entry_is_leaked_and_the_reactor_keeps_going() {
    let r = Reactor::new(ReactorConfig::default());
    let drops = Arc::new(AtomicU64::new(0));
    r.register(Box::new(Panicky(drops.clone())))
        .map_err(|(e, _)| e)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    r.register(Box::new(Flag {
        done: Arc::new(AtomicBool::new(true)),
        tx,
        id: 1,
        polls: Arc::new(AtomicU64::new(0)),
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "never dropped");
}

#[test]
fn config_defaults_spin_briefly_then_sleep_with_a_prewake() {
    let d = ReactorConfig::default();
    assert!(d.yield_for <= d.spin, "no yield phase by default");
    assert!(d.max_sleep >= Duration::from_micros(100));
    assert!(d.prewake_lead > Duration::ZERO);
}

/// An entry with an expected end: pre-woken once, about `lead` before
/// it, and completed after.
struct Expecting {
    end: Instant,
    prewoken: Arc<Mutex<Vec<Instant>>>,
    expected: Option<Instant>,
    tx: mpsc::Sender<Instant>,
}

impl Pending for Expecting {
    fn poll_complete(&mut self) -> bool {
        if Instant::now() < self.end {
            return false;
        }
        let _ = self.tx.send(Instant::now());
        true
    }
    fn expected_end(&self) -> Option<Instant> {
        self.expected
    }
    fn prewake(&mut self, _lead: Duration) {
        self.expected = None;
        self.prewoken.lock().unwrap().push(Instant::now());
    }
}

#[test]
fn an_expected_end_gets_one_prewake_about_the_lead_before_it() {
    let lead = Duration::from_millis(5);
    let r = Reactor::new(ReactorConfig {
        prewake_lead: lead,
        ..ReactorConfig::default()
    });
    let (tx, rx) = mpsc::channel();
    let prewoken = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let end = start + Duration::from_millis(40);
    r.register(Box::new(Expecting {
        end,
        prewoken: prewoken.clone(),
        expected: Some(end),
        tx,
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    let done = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(done >= end);
    let p = prewoken.lock().unwrap().clone();
    assert_eq!(p.len(), 1, "one pre-wake");
    // Not before the lead (the reactor sleeps until then), and before
    // the end (a slow CI machine may wake it late, never after the op).
    assert!(
        p[0] + Duration::from_micros(100) >= end - lead,
        "{:?} early",
        end - lead - p[0]
    );
    assert!(p[0] < done);
}

#[test]
fn a_long_op_costs_few_rounds_not_a_spinning_core() {
    let r = Reactor::new(ReactorConfig::default());
    let (tx, rx) = mpsc::channel();
    let polls = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    r.register(Box::new(Flag {
        done: done.clone(),
        tx,
        id: 1,
        polls: polls.clone(),
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    done.store(true, Ordering::Release);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    // Spinning would poll millions of times in 100 ms; sleeping an
    // eighth of the op's age, up to 1 ms, polls a few hundred times at
    // most (the 50 µs spin phase included).
    let n = polls.load(Ordering::Relaxed);
    assert!(n < 20_000, "{n} polls for one 100 ms op");
}

#[test]
fn after_a_long_op_the_thread_parks_without_spinning() {
    // A spin phase of a minute: only the rule under test parks the
    // thread within the test's time.
    let r = Reactor::new(ReactorConfig {
        spin: Duration::from_secs(60),
        ..ReactorConfig::default()
    });
    let (tx, rx) = mpsc::channel();
    // Ends in 30 ms but is expected to end in a minute: the thread
    // sleeps towards its pre-wake instead of spinning.
    let end = Instant::now() + Duration::from_millis(30);
    r.register(Box::new(Expecting {
        end,
        prewoken: Arc::new(Mutex::new(Vec::new())),
        expected: Some(end + Duration::from_secs(60)),
        tx,
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let t0 = Instant::now();
    while r.stats().parks == 0 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        r.stats().parks,
        1,
        "the thread did not park after a long op"
    );
}

/// An entry with an expected end that notes when it was first polled
/// and when pre-woken.
struct Foreseen {
    end: Instant,
    expected: Option<Instant>,
    first_poll: Arc<Mutex<Option<Instant>>>,
    prewoken: Arc<Mutex<Option<Instant>>>,
}

impl Pending for Foreseen {
    fn poll_complete(&mut self) -> bool {
        let now = Instant::now();
        self.first_poll.lock().unwrap().get_or_insert(now);
        now >= self.end
    }
    fn expected_end(&self) -> Option<Instant> {
        self.expected
    }
    fn prewake(&mut self, _lead: Duration) {
        self.expected = None;
        *self.prewoken.lock().unwrap() = Some(Instant::now());
    }
}

#[test]
fn a_registration_expected_to_end_later_leaves_the_thread_asleep_until_its_prewake() {
    let lead = Duration::from_millis(5);
    // Look-ins every 8 s: the thread sleeps unless woken.
    let r = Reactor::new(ReactorConfig {
        prewake_lead: lead,
        max_sleep: Duration::from_secs(1),
        ..ReactorConfig::default()
    });
    let noted = || Arc::new(Mutex::new(None));
    // Puts the thread to sleep towards a far pre-wake.
    let far = Instant::now() + Duration::from_secs(600);
    let first = noted();
    r.register(Box::new(Foreseen {
        end: far,
        expected: Some(far),
        first_poll: first.clone(),
        prewoken: noted(),
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    // The thread may have parked before the registration, which then only
    // brought its sleep forward to the far pre-wake: wake it to take the
    // entry.
    r.nudge();
    let t0 = Instant::now();
    while first.lock().unwrap().is_none() || !r.shared.sleeping.load(Ordering::SeqCst) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the thread neither polled the entry nor went to sleep"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Registered while the thread sleeps, expected in 60 ms.
    let (polled, prewoken) = (noted(), noted());
    let end = Instant::now() + Duration::from_millis(60);
    r.register(Box::new(Foreseen {
        end,
        expected: Some(end),
        first_poll: polled.clone(),
        prewoken: prewoken.clone(),
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    let t0 = Instant::now();
    while prewoken.lock().unwrap().is_none() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let p = prewoken.lock().unwrap().expect("never pre-woken");
    let seen = polled.lock().unwrap().expect("never polled");
    // The thread first looked at the entry at its pre-wake, not at its
    // registration (without a timer to re-arm it is woken at once).
    #[cfg(target_os = "linux")]
    assert!(
        seen >= end - lead,
        "woken {:?} before the pre-wake",
        end - lead - seen
    );
    assert!(p >= seen && p < end + Duration::from_secs(10));
}

/// A pre-wake only entry (its op is watched elsewhere): counts its
/// polls, notes when it gave its pre-wake.
struct PrewakeOnly {
    expected: Option<Instant>,
    polls: Arc<AtomicU64>,
    fired: Arc<Mutex<Option<Instant>>>,
}

impl Pending for PrewakeOnly {
    fn poll_complete(&mut self) -> bool {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.expected.is_none()
    }
    fn expected_end(&self) -> Option<Instant> {
        self.expected
    }
    fn prewake(&mut self, _lead: Duration) {
        self.expected = None;
        *self.fired.lock().unwrap() = Some(Instant::now());
    }
    fn timer_only(&self) -> bool {
        true
    }
}

#[test]
fn a_prewake_only_entry_costs_the_thread_one_wake_up_at_its_prewake() {
    let lead = Duration::from_millis(5);
    // Look-ins every 80 ms: a 300 ms wait would see three or four.
    let r = Reactor::new(ReactorConfig {
        prewake_lead: lead,
        max_sleep: Duration::from_millis(10),
        ..ReactorConfig::default()
    });
    let polls = Arc::new(AtomicU64::new(0));
    let fired = Arc::new(Mutex::new(None));
    let end = Instant::now() + Duration::from_millis(300);
    r.register(Box::new(PrewakeOnly {
        expected: Some(end),
        polls: polls.clone(),
        fired: fired.clone(),
    }))
    .map_err(|(e, _)| e)
    .unwrap();
    let t0 = Instant::now();
    while r.pending() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "never completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let at = fired.lock().unwrap().expect("never pre-woken");
    assert!(
        at + Duration::from_micros(100) >= end - lead,
        "pre-woken early"
    );
    // Polled at its registration and once after its pre-wake, with no
    // look-in between.
    let n = polls.load(Ordering::Relaxed);
    assert!(n <= 3, "{n} polls");
    // Then the thread parks.
    while r.stats().parks == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
}
