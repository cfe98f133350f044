//! The quorum state machine against a simulated store: many ranks, random
//! interleavings and start times, crashes at any step, replacement ranks
//! joining. Whoever finishes agrees on one roster; the dead and the late
//! are not in it.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::joiner::{JoinAction, JoinOutcome, Joiner};
use super::quorum::{Action, Outcome, Quorum, Roster, POLL};

/// The store's keys of one epoch.
#[derive(Default)]
struct Sim {
    alive: Vec<bool>,
    announced: u64,
    /// `join/{n}` for n from 1, as written so far.
    joins: Vec<Option<usize>>,
    roster: Option<Vec<u8>>,
}

/// One rank in the simulation.
struct Rank {
    q: Option<Quorum>,
    /// A replacement rank: its world rank and its state machine.
    j: Option<(usize, Joiner)>,
    /// The joiner's slot, once it counted itself in.
    slot: Option<usize>,
    joined: Option<JoinOutcome>,
    /// Simulated time at which it runs next.
    at: Instant,
    /// It stops (dies) after this many actions, if set.
    dies_after: Option<usize>,
    steps: usize,
    outcome: Option<Outcome>,
}

const WINDOW: Duration = Duration::from_millis(200);
const GRACE: Duration = Duration::from_millis(300);

/// Runs `size` ranks; `start[r]` is when rank `r` calls reform (None: it
/// is dead), `dies_after[r]` when it dies. Returns each rank's outcome.
fn simulate(
    seed: u64,
    size: usize,
    start: &[Option<Duration>],
    dies_after: &[Option<usize>],
) -> Vec<Option<Outcome>> {
    simulate_joins(seed, size, start, dies_after, &[]).0
}

/// As [`simulate`], with replacement ranks `(world rank, start)` joining
/// epoch 1 (old rank `r` has world rank `r`); also returns the joiners'
/// outcomes.
fn simulate_joins(
    seed: u64,
    size: usize,
    start: &[Option<Duration>],
    dies_after: &[Option<usize>],
    joiners: &[(usize, Duration)],
) -> (Vec<Option<Outcome>>, Vec<Option<JoinOutcome>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let mut sim = Sim {
        alive: vec![false; size],
        ..Sim::default()
    };
    let mut ranks: Vec<Rank> = (0..size)
        .map(|r| Rank {
            q: None,
            j: None,
            slot: None,
            joined: None,
            at: t0 + start[r].unwrap_or(Duration::MAX / 4),
            dies_after: dies_after[r],
            steps: 0,
            outcome: None,
        })
        .collect();
    ranks.extend(joiners.iter().map(|&(w, at)| Rank {
        q: None,
        j: Some((w, Joiner::new(w, 1))),
        slot: None,
        joined: None,
        at: t0 + at,
        dies_after: None,
        steps: 0,
        outcome: None,
    }));
    let agents = ranks.len();
    for _ in 0..200_000 {
        // The rank due first runs one action; ties broken at random.
        let live: Vec<usize> = (0..agents)
            .filter(|&r| r >= size || start[r].is_some())
            .filter(|&r| ranks[r].outcome.is_none() && ranks[r].joined.is_none())
            .filter(|&r| ranks[r].dies_after.is_none_or(|d| ranks[r].steps < d))
            .collect();
        let Some(&first) = live.iter().min_by_key(|&&r| ranks[r].at) else {
            break;
        };
        let due = ranks[first].at;
        let ties: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&r| ranks[r].at <= due + Duration::from_micros(rng.gen_range(0..2000)))
            .collect();
        let r = ties[rng.gen_range(0..ties.len())];
        let now = ranks[r].at.max(due);
        let rank = &mut ranks[r];
        rank.steps += 1;
        // Each store operation takes a little simulated time.
        let cost = Duration::from_micros(rng.gen_range(50..500));
        if let Some((w, j)) = rank.j.as_mut() {
            match j.poll() {
                JoinAction::Probe => j.probed(sim.roster.is_some()),
                JoinAction::Announce => {
                    // Counting in and writing the slot are two steps.
                    if let Some(slot) = rank.slot {
                        sim.joins[slot] = Some(*w);
                        j.announced();
                    } else {
                        sim.joins.push(None);
                        rank.slot = Some(sim.joins.len() - 1);
                    }
                }
                JoinAction::Observe => j.observed(sim.roster.as_deref(), false),
                JoinAction::Wait(d) => {
                    assert!(d <= POLL, "waits are short: {d:?}");
                    rank.at = now + d;
                    continue;
                }
                JoinAction::Done(o) => {
                    rank.joined = Some(o);
                    continue;
                }
            }
            rank.at = now + cost;
            continue;
        }
        let q = rank
            .q
            .get_or_insert_with(|| Quorum::new(r, (0..size).collect(), 1, now, WINDOW, GRACE));
        match q.poll(now) {
            Action::Announce => {
                sim.alive[r] = true;
                sim.announced += 1;
                q.announced(sim.announced);
            }
            Action::Observe => {
                q.observed(sim.roster.as_deref(), sim.announced, sim.joins.len() as u64)
            }
            Action::AwaitRoster(d) => {
                assert!(d > Duration::ZERO);
                // A waiting get, woken by the write: here it looks again
                // a poll later (the state machine waits in between).
                q.roster_seen(sim.roster.as_deref());
            }
            Action::Wait(d) => {
                assert!(d <= POLL, "waits are short: {d:?}");
                rank.at = now + d;
                continue;
            }
            Action::Collect => {
                let js: Vec<usize> = sim.joins.iter().flatten().copied().collect();
                q.collected(&sim.alive, &js, now)
            }
            Action::Close(roster) => {
                assert!(roster.members.contains(&r), "a closer includes itself");
                if sim.roster.is_none() {
                    sim.roster = Some(roster.encode());
                }
                q.closed(sim.roster.as_deref().expect("set"));
            }
            Action::Done(o) => {
                rank.outcome = Some(o);
                continue;
            }
        }
        rank.at = now + cost;
    }
    let joined = ranks[size..].iter().map(|r| r.joined.clone()).collect();
    (
        ranks.into_iter().take(size).map(|r| r.outcome).collect(),
        joined,
    )
}

/// The roster every finished rank agrees on.
fn agreed(outcomes: &[Option<Outcome>]) -> Roster {
    let mut roster: Option<Roster> = None;
    for o in outcomes.iter().flatten() {
        let r = match o {
            Outcome::Member { roster, .. } | Outcome::VotedOut { roster } => roster.clone(),
            Outcome::Corrupt { value } => panic!("corrupt roster {value:?}"),
        };
        match &roster {
            None => roster = Some(r),
            Some(first) => assert_eq!(first, &r, "two ranks saw different rosters"),
        }
    }
    roster.expect("some rank finished")
}

fn ms(v: u64) -> Option<Duration> {
    Some(Duration::from_millis(v))
}

#[test]
fn every_survivor_gets_the_same_roster_and_a_dense_rank() {
    for seed in 0..300 {
        let mut rng = StdRng::seed_from_u64(seed);
        let size = rng.gen_range(2..9);
        // Each rank is dead or starts within half the window.
        let start: Vec<Option<Duration>> = (0..size)
            .map(|_| {
                (rng.gen_range(0..4) != 0).then(|| Duration::from_millis(rng.gen_range(0..100)))
            })
            .collect();
        if start.iter().all(Option::is_none) {
            continue;
        }
        let outs = simulate(seed, size, &start, &vec![None; size]);
        let roster = agreed(&outs);
        let want: Vec<usize> = (0..size).filter(|&r| start[r].is_some()).collect();
        assert_eq!(
            roster.members, want,
            "seed {seed}: everyone alive within the window"
        );
        for (r, o) in outs.iter().enumerate() {
            match (start[r], o) {
                (None, None) => {}
                (Some(_), Some(Outcome::Member { rank, .. })) => {
                    assert_eq!(roster.members[*rank], r, "dense, in old-rank order")
                }
                other => panic!("seed {seed} rank {r}: {other:?}"),
            }
        }
    }
}

#[test]
fn all_alive_closes_early_without_waiting_out_the_window() {
    let outs = simulate(1, 4, &[ms(0), ms(1), ms(2), ms(3)], &[None; 4]);
    assert_eq!(agreed(&outs).members, vec![0, 1, 2, 3]);
}

#[test]
fn a_straggler_after_the_close_is_voted_out() {
    for seed in 0..100 {
        // Rank 1 calls long after the window and the grace.
        let outs = simulate(seed, 3, &[ms(0), ms(2_000), ms(5)], &[None; 3]);
        assert_eq!(agreed(&outs).members, vec![0, 2]);
        assert!(
            matches!(&outs[1], Some(Outcome::VotedOut { roster }) if roster.members == vec![0, 2]),
            "{:?}",
            outs[1]
        );
    }
}

#[test]
fn a_leader_that_dies_mid_close_is_replaced_by_the_fallback() {
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        // Rank 0 starts first (and leads), then dies after 1..6 actions:
        // before, during or after collecting, or after closing.
        let d = rng.gen_range(1..7);
        let outs = simulate(
            seed,
            4,
            &[ms(0), ms(10), ms(20), ms(30)],
            &[Some(d), None, None, None],
        );
        let roster = agreed(&outs);
        for (r, o) in outs.iter().enumerate().skip(1) {
            let o = o.as_ref().expect("the others finish");
            // Rank 0 may be in the roster (it announced) and that is fine:
            // the new group's connection then fails for everyone alike.
            assert!(
                matches!(o, Outcome::Member { .. }),
                "seed {seed} rank {r}: {o:?} (roster {roster})"
            );
        }
    }
}

#[test]
fn two_dead_at_once_and_rank_0_dead() {
    let outs = simulate(7, 5, &[None, ms(3), None, ms(0), ms(9)], &[None; 5]);
    assert_eq!(agreed(&outs).members, vec![1, 3, 4]);
    assert!(matches!(outs[1], Some(Outcome::Member { rank: 0, .. })));
    assert!(matches!(outs[4], Some(Outcome::Member { rank: 2, .. })));
}

#[test]
fn rosters_round_trip_and_garbage_is_refused() {
    let r = Roster {
        epoch: 3,
        members: vec![0, 2, 5],
        joiners: vec![1, 4],
        world: vec![0, 2, 5, 1, 4],
    };
    assert_eq!(Roster::decode(&r.encode()), Some(r.clone()));
    assert_eq!(r.new_rank(2), Some(1));
    assert_eq!(r.new_rank(1), None);
    assert_eq!(r.joiner_rank(4), Some(4));
    assert_eq!(r.joiner_rank(2), None);
    for bad in [
        &b""[..],
        b"x",
        b"chorus-roster/1 epoch=1 members=0",
        b"chorus-roster/2 epoch=1 members= world=",
        b"chorus-roster/2 epoch=1 members=2,1 world=2,1",
        b"chorus-roster/2 epoch=1 members=0 world=0,3,1",
        b"chorus-roster/2 epoch=1 members=0 world=0,0",
        b"chorus-roster/2 epoch=1 members=0,1 world=0",
        b"chorus-roster/2 epoch=1 members=3-1 world=3,2,1",
        b"chorus-roster/2 epoch=1 members=0-99999999999 world=0",
        b"chorus-roster/2 epoch=1 members=0-2,2 world=0,1,2,2",
    ] {
        assert_eq!(Roster::decode(bad), None, "{bad:?}");
    }
    // Runs of ranks are stored as ranges: a roster of thousands stays small.
    let big = Roster {
        epoch: 1,
        members: (0..4096).filter(|&r| r != 2048 && r != 7).collect(),
        joiners: vec![],
        world: (0..4096).filter(|&r| r != 2048 && r != 7).collect(),
    };
    let stored = big.encode();
    assert!(stored.len() < 100, "{}", String::from_utf8_lossy(&stored));
    assert!(String::from_utf8_lossy(&stored).contains("members=0-6,8-2047,2049-4095"));
    assert_eq!(Roster::decode(&stored), Some(big));
    let pair = Roster {
        epoch: 2,
        members: vec![4, 5, 9],
        joiners: vec![],
        world: vec![4, 5, 9],
    };
    assert!(String::from_utf8_lossy(&pair.encode()).contains("members=4,5,9"));
    assert_eq!(Roster::decode(&pair.encode()), Some(pair));
    let mut q = Quorum::new(0, vec![0, 1], 4, Instant::now(), WINDOW, GRACE);
    q.announced(1);
    assert_eq!(q.poll(Instant::now()), Action::Observe);
    q.observed(Some(&r.encode()), 1, 0);
    assert!(
        matches!(
            q.poll(Instant::now()),
            Action::Done(Outcome::Corrupt { .. })
        ),
        "a roster of another epoch is not this one's"
    );
}

/// The joiners' outcomes, checked against the agreed roster: a member
/// joiner has the rank after the survivors', by world rank.
fn check_joiners(seed: u64, roster: &Roster, joined: &[Option<JoinOutcome>], ws: &[usize]) {
    for (o, &w) in joined.iter().zip(ws) {
        match o {
            Some(JoinOutcome::Member { rank, roster: r }) => {
                assert_eq!(
                    r, roster,
                    "seed {seed}: the joiner's roster is the survivors'"
                );
                assert_eq!(roster.world[*rank], w, "seed {seed}");
                assert!(
                    *rank >= roster.members.len(),
                    "seed {seed}: joiners after members"
                );
            }
            Some(JoinOutcome::Passed) => {
                assert!(
                    !roster.joiners.contains(&w),
                    "seed {seed}: passed but listed"
                )
            }
            other => panic!("seed {seed} joiner {w}: {other:?}"),
        }
    }
}

#[test]
fn a_replacement_that_announces_in_time_joins_after_the_survivors() {
    for seed in 0..300 {
        let mut rng = StdRng::seed_from_u64(seed);
        let size = rng.gen_range(2..7);
        // One or two dead ranks (never all), replaced within the window.
        let dead: Vec<usize> = (0..size).filter(|_| rng.gen_range(0..3) == 0).collect();
        if dead.is_empty() || dead.len() == size {
            continue;
        }
        let start: Vec<Option<Duration>> = (0..size)
            .map(|r| (!dead.contains(&r)).then(|| Duration::from_millis(rng.gen_range(0..50))))
            .collect();
        let js: Vec<(usize, Duration)> = dead
            .iter()
            .map(|&w| (w, Duration::from_millis(rng.gen_range(0..100))))
            .collect();
        let (outs, joined) = simulate_joins(seed, size, &start, &vec![None; size], &js);
        let roster = agreed(&outs);
        let survivors: Vec<usize> = (0..size).filter(|r| !dead.contains(r)).collect();
        assert_eq!(roster.members, survivors, "seed {seed}");
        assert_eq!(roster.joiners, dead, "seed {seed}: joiners in time are in");
        let ws: Vec<usize> = js.iter().map(|j| j.0).collect();
        check_joiners(seed, &roster, &joined, &ws);
        assert!(joined
            .iter()
            .all(|o| matches!(o, Some(JoinOutcome::Member { .. }))));
    }
}

#[test]
fn replacements_of_every_missing_member_close_the_roster_before_the_window() {
    // Rank 1 is dead and its replacement announces at once: the leader
    // closes as soon as it sees it, long before the 200 ms window.
    let (outs, joined) = simulate_joins(
        3,
        3,
        &[ms(0), None, ms(1)],
        &[None; 3],
        &[(1, Duration::ZERO)],
    );
    let roster = agreed(&outs);
    assert_eq!(roster.world, vec![0, 2, 1]);
    assert!(matches!(
        joined[0],
        Some(JoinOutcome::Member { rank: 2, .. })
    ));
}

#[test]
fn a_late_replacement_passes_this_epoch_and_random_joiners_agree() {
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        // Rank 2 of 4 is dead; its replacement comes at a random time,
        // before or after the close; a leader may die.
        let late = Duration::from_millis(rng.gen_range(0..1_500));
        let dies = (rng.gen_range(0..3) == 0).then(|| rng.gen_range(1..7));
        let (outs, joined) = simulate_joins(
            seed,
            4,
            &[ms(0), ms(5), None, ms(10)],
            &[dies, None, None, None],
            &[(2, late)],
        );
        let roster = agreed(&outs);
        check_joiners(seed, &roster, &joined, &[2]);
    }
}

#[test]
fn a_leader_told_who_is_gone_closes_once_every_other_rank_announced() {
    let t0 = Instant::now();
    let long = Duration::from_secs(10);
    let mut q = Quorum::new(0, (0..4).collect(), 1, t0, long, long).expect_gone(vec![2]);
    assert_eq!(q.poll(t0), Action::Announce);
    q.announced(1);
    assert_eq!(q.poll(t0), Action::Observe);
    q.observed(None, 2, 0);
    assert!(
        matches!(q.poll(t0), Action::Wait(_)),
        "rank 1 or 3 is missing"
    );
    assert_eq!(q.poll(t0), Action::Observe);
    q.observed(None, 3, 0);
    assert_eq!(q.poll(t0), Action::Collect, "long before the window");
    q.collected(&[true, true, false, true], &[], t0);
    match q.poll(t0) {
        Action::Close(r) => assert_eq!(r.members, vec![0, 1, 3]),
        a => panic!("expected the close, got {a:?}"),
    }
}

#[test]
fn a_gone_rank_that_announces_does_not_close_the_roster_on_a_live_one() {
    let t0 = Instant::now();
    let long = Duration::from_secs(10);
    let mut q = Quorum::new(0, (0..4).collect(), 1, t0, long, long).expect_gone(vec![2]);
    assert_eq!(q.poll(t0), Action::Announce);
    q.announced(1);
    assert_eq!(q.poll(t0), Action::Observe);
    // Ranks 0, 1 and the gone rank 2 announced; rank 3 has not yet.
    q.observed(None, 3, 0);
    assert_eq!(q.poll(t0), Action::Collect);
    q.collected(&[true, true, true, false], &[], t0);
    // Not complete: watch on, and no collect again until the count grows.
    for _ in 0..3 {
        assert_eq!(q.poll(t0), Action::Observe);
        q.observed(None, 3, 0);
        assert!(matches!(q.poll(t0), Action::Wait(_)));
    }
    assert_eq!(q.poll(t0), Action::Observe);
    q.observed(None, 4, 0);
    assert_eq!(q.poll(t0), Action::Collect);
    q.collected(&[true, true, true, true], &[], t0);
    match q.poll(t0) {
        Action::Close(r) => assert_eq!(r.members, vec![0, 1, 2, 3]),
        a => panic!("expected the close, got {a:?}"),
    }
}
