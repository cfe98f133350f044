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
//!    [`POLL`], until one of:
//!    * a roster exists: it is the answer (this rank is in it or was voted
//!      out);
//!    * this rank is the leader and every old member announced, or its
//!      window has passed: it closes the roster;
//!    * its window and a grace period have passed with no roster (the
//!      leader died or stalls): it closes the roster itself.
//! 3. **Close**: collect the `alive/*` flags and write the roster of those
//!    ranks with a compare-and-set from absent. The first close wins; a
//!    later one gets the winner's roster back and adopts it. Every rank that
//!    finishes therefore holds the same roster, and a rank that announced
//!    after it was written is not in it.

use std::fmt;
use std::time::{Duration, Instant};

/// How often a rank waiting for the roster looks at the store.
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// The membership of one epoch: the old ranks that re-form the group, in
/// increasing order (their new ranks are their positions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roster {
    /// The epoch this roster forms.
    pub epoch: u64,
    /// Old ranks of the members, ascending.
    pub members: Vec<usize>,
}

impl Roster {
    /// The new rank of the old rank `old`, if it is a member.
    pub fn new_rank(&self, old: usize) -> Option<usize> {
        self.members.binary_search(&old).ok()
    }

    /// The roster as stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let members: Vec<String> = self.members.iter().map(usize::to_string).collect();
        format!(
            "chorus-roster/1 epoch={} members={}",
            self.epoch,
            members.join(",")
        )
        .into_bytes()
    }

    /// A stored roster; `None` if `bytes` is not one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Roster> {
        let s = std::str::from_utf8(bytes).ok()?;
        let rest = s.strip_prefix("chorus-roster/1 epoch=")?;
        let (epoch, members) = rest.split_once(" members=")?;
        let epoch = epoch.parse().ok()?;
        let members = if members.is_empty() {
            Vec::new()
        } else {
            members
                .split(',')
                .map(str::parse)
                .collect::<Result<Vec<usize>, _>>()
                .ok()?
        };
        let sorted = members.windows(2).all(|w| w[0] < w[1]);
        (sorted && !members.is_empty()).then_some(Roster { epoch, members })
    }
}

impl fmt::Display for Roster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} with old ranks {:?}", self.epoch, self.members)
    }
}

/// What the quorum asks its driver to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Set `alive/{me}`, then add 1 to `announced`; report the count with
    /// [`Quorum::announced`].
    Announce,
    /// Read the roster (if it exists) and the `announced` count; report
    /// them with [`Quorum::observed`].
    Observe,
    /// Sleep this long, then call [`Quorum::poll`] again.
    Wait(Duration),
    /// Read which old ranks have announced (`alive/{r}` for every old
    /// rank); report them with [`Quorum::collected`].
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
    epoch: u64,
    deadline: Instant,
    fallback: Instant,
    leader: bool,
    announced: u64,
    state: State,
    /// The roster this rank closes with, once collected.
    pending: Option<Roster>,
    outcome: Option<Outcome>,
}

impl Quorum {
    /// The quorum of old rank `me` of a group of `size` ranks for `epoch`,
    /// started at `now`: it closes the roster `window` after `now` as
    /// leader, or `window + grace` after `now` if no roster appeared.
    pub(crate) fn new(
        me: usize,
        size: usize,
        epoch: u64,
        now: Instant,
        window: Duration,
        grace: Duration,
    ) -> Quorum {
        let deadline = now + window;
        Quorum {
            me,
            size,
            epoch,
            deadline,
            fallback: deadline + grace,
            leader: false,
            announced: 0,
            state: State::Announce,
            pending: None,
            outcome: None,
        }
    }

    /// The next action at `now`.
    pub(crate) fn poll(&mut self, now: Instant) -> Action {
        match self.state {
            State::Announce => Action::Announce,
            State::Watch { observe: true } => Action::Observe,
            State::Watch { observe: false } => {
                let close = (self.leader
                    && (self.announced >= self.size as u64 || now >= self.deadline))
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
    pub(crate) fn observed(&mut self, roster: Option<&[u8]>, announced: u64) {
        if !matches!(self.state, State::Watch { .. }) {
            return;
        }
        self.announced = self.announced.max(announced);
        match roster {
            Some(value) => self.finish(value),
            None => self.state = State::Watch { observe: false },
        }
    }

    /// Which old ranks have announced (`alive[r]` for old rank `r`).
    pub(crate) fn collected(&mut self, alive: &[bool]) {
        if self.state != State::Collect {
            return;
        }
        let members: Vec<usize> = (0..self.size)
            .filter(|&r| r == self.me || alive.get(r).copied().unwrap_or(false))
            .collect();
        self.state = State::Closing;
        self.pending = Some(Roster {
            epoch: self.epoch,
            members,
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
