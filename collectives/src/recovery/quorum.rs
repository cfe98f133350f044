//! The quorum that re-forms a group after a failure, as a deterministic,
//! I/O-free state machine: the store I/O that drives it is
//! `recovery::store_io`. docs/ARCHITECTURE.md, "Re-forming a group", gives
//! the protocol and why it agrees.
//!
//! Each survivor of a group at epoch `e` runs one [`Quorum`] for epoch
//! `e + 1` over the keys of that epoch:
//!
//! 1. **Announce**: set `alive/{old rank}`, then add 1 to `announced`; the
//!    rank that gets 1 back is the *leader*.
//! 2. **Observe** the `roster` key and the `announced` count, every
//!    [`POLL`] (the leader), or wait for the roster to be written (the
//!    others, whose only other way out is the fallback), until one of:
//!    * a roster exists: it is the answer (this rank is in it or was voted
//!      out);
//!    * this rank is the leader and every old member announced, or its
//!      window has passed: it closes the roster;
//!    * its window and a grace period have passed with no roster (the
//!      leader died or stalls): it closes the roster itself.
//!    * this rank is the leader, and every old member either announced or
//!      has a joiner for its world rank (a replacement the launcher
//!      restarted, see `recovery::joiner`): it closes the roster early.
//! 3. **Close**: collect the `alive/*` flags and the joiners (`joined`
//!    counts them, `join/{n}` holds the world rank of the `n`-th) and write
//!    the roster of those ranks with a compare-and-set from absent: the
//!    survivors in old-rank order, then the joiners by world rank. The
//!    first close wins; a later one gets the winner's roster back and
//!    adopts it. Every rank that finishes therefore holds the same roster,
//!    and a rank that announced after it was written is not in it.

use std::fmt;
use std::time::{Duration, Instant};

/// How often a rank waiting for the roster looks at the store.
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// The membership of one epoch: the old ranks that re-form the group, in
/// increasing order, then the joiners (their new ranks are their positions
/// in [`world`](Self::world)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roster {
    /// The epoch this roster forms.
    pub epoch: u64,
    /// Old ranks of the members that were in the group before, ascending
    /// (new ranks `0..members.len()`).
    pub members: Vec<usize>,
    /// World ranks of the joiners (replacement ranks), ascending (new ranks
    /// from `members.len()` on).
    pub joiners: Vec<usize>,
    /// World rank of each new rank: the members', then the joiners.
    pub world: Vec<usize>,
}

impl Roster {
    /// The new rank of the old rank `old`, if it is a member.
    pub fn new_rank(&self, old: usize) -> Option<usize> {
        self.members.binary_search(&old).ok()
    }

    /// The new rank of the joiner with world rank `world`, if it is one.
    pub fn joiner_rank(&self, world: usize) -> Option<usize> {
        self.joiners
            .binary_search(&world)
            .ok()
            .map(|i| self.members.len() + i)
    }

    /// The roster as stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "chorus-roster/2 epoch={} members={} world={}",
            self.epoch,
            list(&self.members),
            list(&self.world)
        )
        .into_bytes()
    }

    /// A stored roster; `None` if `bytes` is not one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Roster> {
        let s = std::str::from_utf8(bytes).ok()?;
        let rest = s.strip_prefix("chorus-roster/2 epoch=")?;
        let (epoch, rest) = rest.split_once(" members=")?;
        let (members, world) = rest.split_once(" world=")?;
        let epoch = epoch.parse().ok()?;
        let (members, world) = (parse_list(members)?, parse_list(world)?);
        let joiners = world.get(members.len()..)?.to_vec();
        let ascending = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]);
        let mut distinct = world.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let valid = ascending(&members)
            && ascending(&joiners)
            && !members.is_empty()
            && distinct.len() == world.len();
        valid.then_some(Roster {
            epoch,
            members,
            joiners,
            world,
        })
    }
}

/// A list of ranks as stored: runs of consecutive ranks as `first-last`
/// (every survivor reads the roster: at thousands of ranks it stays a few
/// bytes, not tens of kilobytes each).
fn list(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j > i + 1 {
            format!("{}-{}", v[i], v[j])
        } else if j == i + 1 {
            format!("{},{}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// Ranks a stored list can hold at most (a run is checked before it is
/// expanded).
const MAX_LISTED: usize = 1 << 24;

fn parse_list(s: &str) -> Option<Vec<usize>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for x in s.split(',') {
        match x.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a >= MAX_LISTED || out.len() + (b - a) >= MAX_LISTED {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(x.parse().ok()?),
        }
    }
    Some(out)
}

impl fmt::Display for Roster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "epoch {} with old ranks {:?} and joiners {:?}",
            self.epoch, self.members, self.joiners
        )
    }
}

/// What the quorum asks its driver to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Set `alive/{me}`, then add 1 to `announced`; report the count with
    /// [`Quorum::announced`].
    Announce,
    /// Read the roster (if it exists) and the `announced` and `joined`
    /// counts; report them with [`Quorum::observed`].
    Observe,
    /// Wait up to this long for the roster to be written (a waiting get,
    /// woken by the write: no polling); report what it found with
    /// [`Quorum::roster_seen`]. Only the leader watches the counts, so a
    /// rank that does not lead costs the store one request per wait.
    AwaitRoster(Duration),
    /// Sleep this long, then call [`Quorum::poll`] again.
    Wait(Duration),
    /// Read which old ranks have announced (`alive/{r}` for every old
    /// rank) and the joiners' world ranks (`join/{n}` for `n` in
    /// `1..=joined`, skipping those not written yet); report them with
    /// [`Quorum::collected`].
    Collect,
    /// Compare-and-set the roster from absent to this one; report the
    /// roster stored afterwards (this one or an earlier close's) with
    /// [`Quorum::closed`].
    Close(Roster),
    /// The quorum is over.
    Done(Outcome),
}

/// How the quorum ended for this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// This rank is a member of the new group, with this new rank.
    Member { rank: usize, roster: Roster },
    /// The roster was closed without this rank.
    VotedOut { roster: Roster },
    /// The roster in the store is not one (not written by chorus, or by an
    /// incompatible version): the raw value.
    Corrupt { value: Vec<u8> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Announce,
    /// Waiting for announcements or the roster; `observe` says whether the
    /// store should be read before deciding.
    Watch {
        observe: bool,
    },
    Collect,
    Closing,
    Done,
}

/// One rank's part in forming one epoch (see the module docs).
#[derive(Debug)]
pub(crate) struct Quorum {
    me: usize,
    size: usize,
    /// World rank of each old rank.
    world_of: Vec<usize>,
    epoch: u64,
    deadline: Instant,
    fallback: Instant,
    leader: bool,
    announced: u64,
    joined: u64,
    /// The `joined` count of the last collect that found the roster not
    /// yet complete (the leader collects again only when it grows).
    checked: u64,
    /// Old ranks this rank's liveness found silent or lost: the leader
    /// need not wait its window for them.
    gone: Vec<usize>,
    /// The `announced` count of the last collect made because every rank
    /// but the gone ones had announced.
    checked_announced: u64,
    state: State,
    /// The roster this rank closes with, once collected.
    pending: Option<Roster>,
    outcome: Option<Outcome>,
}

impl Quorum {
    /// The quorum of old rank `me` of a group whose old rank `r` has
    /// world rank `world_of[r]`, for `epoch`, started at `now`: it closes
    /// the roster `window` after `now` as leader, or `window + grace` after
    /// `now` if no roster appeared.
    pub(crate) fn new(
        me: usize,
        world_of: Vec<usize>,
        epoch: u64,
        now: Instant,
        window: Duration,
        grace: Duration,
    ) -> Quorum {
        let deadline = now + window;
        Quorum {
            me,
            size: world_of.len(),
            world_of,
            epoch,
            deadline,
            fallback: deadline + grace,
            leader: false,
            announced: 0,
            joined: 0,
            checked: 0,
            gone: Vec::new(),
            checked_announced: 0,
            state: State::Announce,
            pending: None,
            outcome: None,
        }
    }

    /// Old ranks known gone (liveness found them silent or lost): once
    /// every other old rank announced, the leader closes without waiting
    /// out its window. A gone rank that announced in time is a member all
    /// the same.
    pub(crate) fn expect_gone(mut self, gone: Vec<usize>) -> Quorum {
        self.gone = gone;
        self.gone.sort_unstable();
        self.gone.dedup();
        self.gone.retain(|&r| r < self.size && r != self.me);
        self
    }

    /// The next action at `now`.
    pub(crate) fn poll(&mut self, now: Instant) -> Action {
        match self.state {
            State::Announce => Action::Announce,
            State::Watch { observe: true } if !self.leader && now < self.fallback => {
                Action::AwaitRoster(self.fallback.saturating_duration_since(now))
            }
            State::Watch { observe: true } => Action::Observe,
            State::Watch { observe: false } => {
                // Joiners may replace the old members that did not
                // announce: worth a collect to see.
                let replaced =
                    self.joined > self.checked && self.announced + self.joined >= self.size as u64;
                // Every rank but the gone ones may have announced: worth
                // a collect to see (again only once more have).
                let but_gone = !self.gone.is_empty()
                    && self.announced > self.checked_announced
                    && self.announced + self.gone.len() as u64 >= self.size as u64;
                let close = (self.leader
                    && (self.announced >= self.size as u64
                        || now >= self.deadline
                        || replaced
                        || but_gone))
                    || now >= self.fallback;
                if close {
                    self.state = State::Collect;
                    return Action::Collect;
                }
                self.state = State::Watch { observe: true };
                let next = if self.leader {
                    self.deadline
                } else {
                    self.fallback
                };
                Action::Wait(POLL.min(next.saturating_duration_since(now)))
            }
            State::Collect => Action::Collect,
            State::Closing => match &self.pending {
                Some(r) => Action::Close(r.clone()),
                None => Action::Collect,
            },
            State::Done => Action::Done(
                self.outcome
                    .clone()
                    .unwrap_or(Outcome::Corrupt { value: Vec::new() }),
            ),
        }
    }

    /// This rank announced itself; `count` is what adding to `announced`
    /// returned (1: this rank announced first and leads).
    pub(crate) fn announced(&mut self, count: u64) {
        if self.state == State::Announce {
            self.leader = count == 1;
            self.announced = count;
            self.state = State::Watch { observe: true };
        }
    }

    /// What the store holds: the roster's stored value (if the key exists)
    /// and the `announced` count.
    pub(crate) fn observed(&mut self, roster: Option<&[u8]>, announced: u64, joined: u64) {
        if !matches!(self.state, State::Watch { .. }) {
            return;
        }
        self.announced = self.announced.max(announced);
        self.joined = self.joined.max(joined);
        match roster {
            Some(value) => self.finish(value),
            None => self.state = State::Watch { observe: false },
        }
    }

    /// The roster's stored value, if a wait for it ([`Action::AwaitRoster`])
    /// found it written.
    pub(crate) fn roster_seen(&mut self, roster: Option<&[u8]>) {
        if !matches!(self.state, State::Watch { .. }) {
            return;
        }
        match roster {
            Some(value) => self.finish(value),
            None => self.state = State::Watch { observe: false },
        }
    }

    /// Which old ranks have announced (`alive[r]` for old rank `r`), and
    /// the world ranks of the joiners found (in any order, repeats
    /// allowed), at `now`. Joiners whose world rank is an announced
    /// member's are left out (a launcher restarts only ranks that exited).
    pub(crate) fn collected(&mut self, alive: &[bool], joiners: &[usize], now: Instant) {
        if self.state != State::Collect {
            return;
        }
        let members: Vec<usize> = (0..self.size)
            .filter(|&r| r == self.me || alive.get(r).copied().unwrap_or(false))
            .collect();
        let taken: Vec<usize> = members.iter().map(|&r| self.world_of[r]).collect();
        let mut joiners: Vec<usize> = joiners
            .iter()
            .copied()
            .filter(|w| !taken.contains(w))
            .collect();
        joiners.sort_unstable();
        joiners.dedup();
        let mut is_member = vec![false; self.size];
        for &r in &members {
            is_member[r] = true;
        }
        let complete = (0..self.size).all(|r| {
            is_member[r]
                || joiners.contains(&self.world_of[r])
                || self.gone.binary_search(&r).is_ok()
        });
        let due = now >= self.deadline || self.announced >= self.size as u64;
        if self.leader && !complete && !due && now < self.fallback {
            // Collected early for joiners that do not cover the missing
            // members yet: watch on.
            self.checked = self.joined;
            self.checked_announced = self.announced;
            self.state = State::Watch { observe: true };
            return;
        }
        let mut world = taken;
        world.extend(&joiners);
        self.state = State::Closing;
        self.pending = Some(Roster {
            epoch: self.epoch,
            members,
            joiners,
            world,
        });
    }

    /// The roster stored after this rank's compare-and-set.
    pub(crate) fn closed(&mut self, stored: &[u8]) {
        if self.state == State::Closing {
            self.finish(stored);
        }
    }

    fn finish(&mut self, value: &[u8]) {
        let outcome = match Roster::decode(value) {
            Some(roster) if roster.epoch == self.epoch => match roster.new_rank(self.me) {
                Some(rank) => Outcome::Member { rank, roster },
                None => Outcome::VotedOut { roster },
            },
            _ => Outcome::Corrupt {
                value: value.to_vec(),
            },
        };
        self.outcome = Some(outcome);
        self.state = State::Done;
    }
}
