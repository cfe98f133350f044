use std::time::{Duration, Instant};

use super::beat::period;
use super::marks::{LEFT, LOST};
use super::ring::{Entry, Ring, Verdict};

const T: Duration = Duration::from_secs(3);
const P: Duration = Duration::from_millis(300);

#[test]
fn the_period_is_a_tenth_of_the_timeout_within_bounds() {
    assert_eq!(period(Duration::from_secs(3)), Duration::from_millis(300));
    assert_eq!(period(Duration::from_secs(60)), Duration::from_millis(300));
    assert_eq!(
        period(Duration::from_millis(100)),
        Duration::from_millis(50)
    );
    assert_eq!(period(Duration::from_secs(1)), Duration::from_millis(100));
}

#[test]
fn entries_survive_the_store() {
    for e in [Entry::Silent(3), Entry::Alive(0), Entry::Lost(4095)] {
        assert_eq!(Entry::decode(e.encode().as_bytes()), Some(e));
    }
    assert_eq!(Entry::decode(b"gone 3"), None);
    assert_eq!(Entry::decode(b"silent x"), None);
}

/// What a simulated rank does each round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// Beats, reads, publishes.
    Live,
    /// Stopped (SIGSTOP, a hung host): does nothing.
    Stopped,
    /// Cut off from the store: beats and reads fail.
    CutOff,
    /// Left the group cleanly.
    Left,
}

/// A group of `Ring`s over a simulated store: the counters, the verdict
/// log, and a clock that moves one period per round. Every rank runs its
/// round as the liveness task does (beat, read the watched counters and
/// the log's count, read new entries, publish).
struct Sim {
    now: Instant,
    counters: Vec<i64>,
    log: Vec<Entry>,
    rings: Vec<Ring>,
    st: Vec<St>,
    /// Counter reads per round, to check the cost.
    reads: usize,
}

impl Sim {
    fn new(n: usize) -> Sim {
        let now = Instant::now();
        Sim {
            now,
            counters: vec![1; n],
            log: Vec::new(),
            rings: (0..n).map(|r| Ring::new(r, n, T, now)).collect(),
            st: vec![St::Live; n],
            reads: 0,
        }
    }

    fn round(&mut self) {
        self.now += P;
        self.reads = 0;
        for r in 0..self.rings.len() {
            match self.st[r] {
                St::Live => {}
                St::CutOff => {
                    self.rings[r].store_failed("connection refused".into());
                    continue;
                }
                St::Stopped | St::Left => continue,
            }
            self.counters[r] += 1;
            let ring = &mut self.rings[r];
            let values: Vec<Option<i64>> = ring
                .watched()
                .iter()
                .map(|&p| Some(self.counters[p]))
                .collect();
            self.reads += values.len();
            ring.read(&values, self.log.len() as u64, self.now);
            if let Some(u) = ring.unread() {
                let entries: Vec<Option<Entry>> =
                    u.map(|n| self.log.get(n as usize - 1).copied()).collect();
                ring.log_read(&entries, self.now);
            }
            let posts = ring.take_posts();
            self.log.extend(posts);
        }
    }

    fn rounds(&mut self, n: usize) {
        for _ in 0..n {
            self.round();
        }
    }

    /// Rounds until every live rank's verdict satisfies `ok`, at most
    /// `most`; how many it took.
    fn until(&mut self, most: usize, ok: impl Fn(usize, &Verdict) -> bool) -> usize {
        for i in 1..=most {
            self.round();
            let all = (0..self.rings.len())
                .filter(|&r| self.st[r] == St::Live)
                .all(|r| ok(r, &self.rings[r].verdict(self.now)));
            if all {
                return i;
            }
        }
        panic!(
            "not every live rank got there in {most} rounds; log {:?}",
            self.log
        );
    }

    fn leave(&mut self, r: usize) {
        self.counters[r] += LEFT;
        self.st[r] = St::Left;
    }
}

/// Rounds within which every rank must learn of a silent peer: the
/// timeout, the watcher's reading a period late, and one period for the
/// others to read the log.
fn within() -> usize {
    (T.as_millis() / P.as_millis()) as usize + 3
}

fn silent(peer: usize) -> impl Fn(usize, &Verdict) -> bool {
    move |_, v| matches!(v, Verdict::PeerSilent { peer: p, .. } if *p == peer)
}

#[test]
fn ranks_that_beat_stay_alive_and_each_reads_one_counter() {
    let mut s = Sim::new(64);
    for _ in 0..100 {
        s.round();
        assert_eq!(s.reads, 64, "one counter per rank and round");
        for r in 0..64 {
            assert_eq!(s.rings[r].verdict(s.now), Verdict::Alive);
            assert_eq!(s.rings[r].watched(), vec![(r + 63) % 64]);
        }
    }
    assert!(s.log.is_empty());
}

#[test]
fn a_stopped_rank_is_silent_on_every_rank_within_the_timeout_and_three_periods() {
    let mut s = Sim::new(64);
    s.rounds(3);
    s.st[17] = St::Stopped;
    let took = s.until(within(), silent(17));
    // Not before the timeout.
    assert!(took >= (T.as_millis() / P.as_millis()) as usize, "{took}");
    // One verdict, by its watcher, and the watcher moved on past it.
    assert_eq!(s.log, vec![Entry::Silent(17)]);
    assert_eq!(s.rings[18].watched(), vec![17, 16]);
    // Long after: still silent, still one verdict.
    s.rounds(50);
    assert_eq!(s.log, vec![Entry::Silent(17)]);
    assert!(matches!(
        s.rings[40].verdict(s.now),
        Verdict::PeerSilent { peer: 17, silent_for } if silent_for >= T
    ));
}

#[test]
fn a_dead_watcher_does_not_hide_the_rank_it_watched() {
    let mut s = Sim::new(16);
    s.rounds(2);
    // Rank 5 (which watches rank 4) dies, and after it rank 4.
    s.st[5] = St::Stopped;
    s.until(within(), silent(5));
    s.st[4] = St::Stopped;
    // Rank 6 now watches 5 and 4: it finds 4 within the timeout too.
    s.until(within(), |_, _| true);
    let took = (1..=within())
        .find(|_| {
            s.round();
            s.log.contains(&Entry::Silent(4))
        })
        .expect("rank 4 found silent");
    assert!(took <= within());
    s.round();
    for r in (0..16).filter(|&r| s.st[r] == St::Live) {
        assert!(
            !matches!(s.rings[r].verdict(s.now), Verdict::Alive),
            "rank {r}"
        );
    }
    assert_eq!(s.rings[6].watched(), vec![5, 4, 3]);
}

#[test]
fn two_adjacent_deaths_at_once_are_both_found() {
    let mut s = Sim::new(32);
    s.rounds(2);
    s.st[9] = St::Stopped;
    s.st[10] = St::Stopped;
    // The first (the one whose watcher lives) fails every rank's works
    // within the timeout.
    s.until(within(), silent(10));
    // The other is found by the same watcher one timeout later.
    for _ in 0..within() {
        s.round();
    }
    assert!(s.log.contains(&Entry::Silent(9)), "{:?}", s.log);
    assert_eq!(s.log.len(), 2, "{:?}", s.log);
    assert_eq!(s.rings[11].watched(), vec![10, 9, 8]);
}

#[test]
fn a_rank_that_left_is_never_silent_and_its_successor_watches_past_it() {
    let mut s = Sim::new(8);
    s.rounds(2);
    s.leave(3);
    s.rounds(3 * within());
    assert!(s.log.is_empty(), "{:?}", s.log);
    for r in (0..8).filter(|&r| r != 3) {
        assert_eq!(s.rings[r].verdict(s.now), Verdict::Alive, "rank {r}");
    }
    assert_eq!(s.rings[4].watched(), vec![2]);
    // A death behind the one that left is still found.
    s.st[2] = St::Stopped;
    s.until(within() + 1, silent(2));
}

#[test]
fn a_rank_cut_off_from_the_store_knows_it_and_the_others_find_it_silent() {
    let mut s = Sim::new(16);
    s.rounds(2);
    s.st[7] = St::CutOff;
    s.until(within(), silent(7));
    match s.rings[7].verdict(s.now) {
        Verdict::StoreSilent { silent_for, cause } => {
            assert!(silent_for >= T);
            assert_eq!(cause, "connection refused");
        }
        v => panic!("the cut-off rank must know it, got {v:?}"),
    }
}

#[test]
fn a_rank_that_comes_back_is_alive_again_everywhere() {
    let mut s = Sim::new(16);
    s.rounds(2);
    s.st[12] = St::Stopped;
    s.until(within(), silent(12));
    s.st[12] = St::Live;
    s.until(3, |_, v| *v == Verdict::Alive);
    assert_eq!(s.log, vec![Entry::Silent(12), Entry::Alive(12)]);
    assert_eq!(s.rings[13].watched(), vec![12]);
    // And it can be found silent again.
    s.st[12] = St::Stopped;
    s.until(within(), silent(12));
}

#[test]
fn a_lost_mark_on_a_watched_counter_is_seen_at_once() {
    let mut s = Sim::new(4);
    s.rounds(2);
    s.counters[3] += LOST;
    s.round();
    assert_eq!(s.rings[0].lost(), &[3]);
    // Lost entries in the log reach every rank.
    s.log.push(Entry::Lost(1));
    s.round();
    for r in [0, 2] {
        assert!(s.rings[r].lost().contains(&1), "rank {r}");
    }
}

#[test]
fn an_entry_counted_but_never_written_is_skipped_after_the_timeout() {
    let t0 = Instant::now();
    let mut r = Ring::new(0, 3, T, t0);
    r.read(&[Some(1)], 2, t0);
    assert_eq!(r.unread(), Some(1..=2));
    r.log_missing(t0);
    r.log_missing(t0 + T - Duration::from_millis(1));
    assert_eq!(r.unread(), Some(1..=2));
    r.log_missing(t0 + T);
    assert_eq!(r.unread(), Some(2..=2));
    r.log_read(&[Some(Entry::Silent(1))], t0 + T);
    assert_eq!(r.unread(), None);
    r.read(&[Some(2)], 2, t0 + T);
    assert!(matches!(
        r.verdict(t0 + T),
        Verdict::PeerSilent { peer: 1, .. }
    ));
}

#[test]
fn a_silent_store_is_reported_before_any_peer() {
    let t0 = Instant::now();
    let mut r = Ring::new(0, 3, T, t0);
    r.read(&[Some(1)], 0, t0);
    r.store_failed("connection refused".into());
    assert_eq!(r.verdict(t0 + Duration::from_secs(2)), Verdict::Alive);
    assert!(matches!(
        r.verdict(t0 + Duration::from_millis(3_500)),
        Verdict::StoreSilent { .. }
    ));
    r.read(&[Some(2)], 0, t0 + Duration::from_millis(3_600));
    assert_eq!(r.verdict(t0 + Duration::from_millis(3_600)), Verdict::Alive);
}

#[test]
fn a_group_of_one_watches_nobody_and_is_always_alive() {
    let t0 = Instant::now();
    let mut r = Ring::new(0, 1, T, t0);
    assert!(r.watched().is_empty());
    r.read(&[], 0, t0 + Duration::from_secs(10));
    assert_eq!(r.verdict(t0 + Duration::from_secs(10)), Verdict::Alive);
}

#[test]
fn everyone_else_dead_is_watched_without_end() {
    let mut s = Sim::new(4);
    s.rounds(2);
    for r in 1..4 {
        s.st[r] = St::Stopped;
    }
    s.rounds(4 * within());
    assert_eq!(s.rings[0].watched(), vec![3, 2, 1]);
    let mut found: Vec<Entry> = s.log.clone();
    found.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        found,
        vec![Entry::Silent(1), Entry::Silent(2), Entry::Silent(3)]
    );
}

/// The liveness task of rank 0 of a group of 4 on `store`, with one
/// pending work, and peers 2 and 3 beating every period from a task of
/// their own (peer 1 beat once and stopped, as a process killed).
mod task {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use chorus_core::work::OpFuture;
    use chorus_core::{OpContext, Registry, WorkError};
    use chorus_store::{InMemoryStore, Store};

    use super::super::beat::{key, period};
    use super::super::marks::LOST;
    use super::super::{Liveness, PeerWitness, Report};
    use crate::watchdog::ErrorPolicy;

    const TIMEOUT: Duration = Duration::from_millis(1_500);
    const BOUND: Duration = Duration::from_secs(20);

    struct Setup {
        store: Arc<dyn Store>,
        reg: Arc<Registry>,
        witness: Arc<PeerWitness>,
        work: OpFuture<u32>,
        beating: Arc<AtomicBool>,
        _task: super::super::LivenessTask,
    }

    fn start(beaters: &'static [usize]) -> Setup {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let reg = Arc::new(Registry::new());
        let witness = Arc::new(PeerWitness::new(TIMEOUT));
        let l = Liveness {
            store: store.clone(),
            epoch: 0,
            group: "g".into(),
            rank: 0,
            size: 4,
            timeout: TIMEOUT,
            policy: ErrorPolicy::AbortGroup,
            witness: witness.clone(),
        };
        let h = chorus_store::rt::handle().expect("chorus's runtime");
        h.block_on(l.first_beat()).expect("first beat");
        for p in 1..4 {
            h.block_on(store.add(&key(0, p), 1))
                .expect("a peer's first beat");
        }
        let beating = Arc::new(AtomicBool::new(true));
        let (s, on) = (store.clone(), beating.clone());
        h.spawn(async move {
            while on.load(Ordering::Acquire) {
                for &p in beaters {
                    let _ = s.add(&key(0, p), 1).await;
                }
                tokio::time::sleep(period(TIMEOUT)).await;
            }
        });
        let ctx = OpContext::new(0, "g".into(), 5, "all_reduce");
        let (work, completer) = OpFuture::<u32>::new(ctx, &reg, None).expect("register");
        std::mem::forget(completer);
        let task = l.start(&reg);
        Setup {
            store,
            reg,
            witness,
            work,
            beating,
            _task: task,
        }
    }

    fn counter(store: &Arc<dyn Store>, peer: usize) -> i64 {
        let s = store.clone();
        chorus_store::rt::handle()
            .expect("runtime")
            .block_on(async move { s.add(&key(0, peer), 0).await })
            .expect("counter")
    }

    #[test]
    fn a_failure_the_backend_cannot_name_fails_the_group_naming_the_peer_that_stopped() {
        let s = start(&[2, 3]);
        std::thread::sleep(period(TIMEOUT) * 2);
        let t0 = Instant::now();
        assert_eq!(s.witness.report("ncclRemoteError", t0), Report::Hold);
        let err = s
            .work
            .wait_timeout(BOUND)
            .expect_err("the work must fail")
            .error;
        s.beating.store(false, Ordering::Release);
        match &err {
            WorkError::PeerLost { peer, cause, .. } => {
                assert_eq!(*peer, 1, "{err}");
                assert!(cause.contains("ncclRemoteError"), "{cause}");
                assert!(
                    cause.contains("rank 1's beat in the group's store stopped"),
                    "{cause}"
                );
            }
            e => panic!("expected PeerLost naming rank 1, got {e}"),
        }
        // (Named as lost, not silent: before the liveness timeout.)
        // The other ranks are told through the store.
        assert!(counter(&s.store, 1) >= LOST);
        assert!(counter(&s.store, 2) < LOST && counter(&s.store, 3) < LOST);
        assert_eq!(s.reg.errored().map(|e| e.kind()), Some("PeerLost"));
    }

    #[test]
    fn a_peer_another_rank_marked_lost_fails_the_pending_works_at_once() {
        let s = start(&[1, 2, 3]);
        std::thread::sleep(period(TIMEOUT) * 2);
        let st = s.store.clone();
        chorus_store::rt::handle()
            .expect("runtime")
            .block_on(async move { st.add(&key(0, 3), LOST).await })
            .expect("mark");
        let err = s
            .work
            .wait_timeout(BOUND)
            .expect_err("the work must fail")
            .error;
        s.beating.store(false, Ordering::Release);
        match &err {
            WorkError::PeerLost { peer, cause, .. } => {
                assert_eq!(*peer, 3, "{err}");
                assert!(
                    cause.contains("another rank of the group found rank 3 lost"),
                    "{cause}"
                );
            }
            e => panic!("expected PeerLost naming rank 3, got {e}"),
        }
    }

    #[test]
    fn when_every_peer_still_beats_the_backends_error_stands() {
        let s = start(&[1, 2, 3]);
        std::thread::sleep(period(TIMEOUT) * 2);
        let t0 = Instant::now();
        assert_eq!(s.witness.report("ncclSystemError", t0), Report::Hold);
        // The search clears the report once every peer moved.
        let deadline = Instant::now() + BOUND;
        while s.witness.report("ncclSystemError", Instant::now()) == Report::Hold {
            assert!(Instant::now() < deadline, "the search never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        s.beating.store(false, Ordering::Release);
        assert!(
            s.reg.errored().is_none(),
            "nobody is lost: the group stays up"
        );
        assert!(!s.work.is_done());
    }
}
