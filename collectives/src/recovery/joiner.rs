//! A replacement rank joining a running group, as a deterministic, I/O-free
//! state machine: the store I/O that drives it is `recovery::store_io`.
//! docs/ARCHITECTURE.md, "Growing back", gives the protocol.
//!
//! A rank that a launcher restarted in place (its predecessor died) runs
//! one [`Joiner`] per epoch `e`, from epoch 1 on, over the keys of that
//! epoch (the same keys the survivors' [`Quorum`](super::quorum::Quorum)
//! uses):
//!
//! 1. **Probe**: if the roster of `e` exists, that epoch was formed without
//!    this rank: try `e + 1`.
//! 2. **Announce**: `n = add(joined, 1)`, then set `join/{n}` to this
//!    rank's world rank.
//! 3. **Observe** the roster of `e`, and whether one of `e + 1` exists,
//!    every [`POLL`], until one of:
//!    * the roster of `e` exists and names this world rank as a joiner:
//!      this rank is in, with the rank it gives;
//!    * it exists without this rank (it announced after the close), or the
//!      survivors formed `e + 1` past it: try `e + 1`.
//!
//! A joiner never closes a roster: only the survivors do, so the group's
//! members decide when it grows (at a failure's re-form, or when they
//! admit joiners at a step boundary). The driver bounds the whole search by
//! a deadline.

use super::quorum::{Roster, POLL};
use std::time::Duration;

/// What the joiner asks its driver to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JoinAction {
    /// Report whether the roster of this epoch exists with
    /// [`Joiner::probed`].
    Probe,
    /// Add 1 to `joined`, then set `join/{count}` to this rank's world
    /// rank; then call [`Joiner::announced`].
    Announce,
    /// Read the roster (if it exists) and whether the next epoch's roster
    /// exists; report them with [`Joiner::observed`].
    Observe,
    /// Sleep this long, then call [`Joiner::poll`] again.
    Wait(Duration),
    /// This epoch is over for the joiner.
    Done(JoinOutcome),
}

/// How one epoch ended for a joiner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JoinOutcome {
    /// This rank joined the epoch with this new rank.
    Member { rank: usize, roster: Roster },
    /// The epoch was (or will be) formed without this rank: try the next.
    Passed,
    /// The stored roster is not one chorus wrote: the raw value.
    Corrupt { value: Vec<u8> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Probe,
    Announce,
    Watch { observe: bool },
    Done,
}

/// One replacement rank's attempt to join one epoch (see the module docs).
#[derive(Debug)]
pub(crate) struct Joiner {
    world_rank: usize,
    epoch: u64,
    state: State,
    outcome: Option<JoinOutcome>,
}

impl Joiner {
    /// The attempt of the rank with world rank `world_rank` to join `epoch`.
    pub(crate) fn new(world_rank: usize, epoch: u64) -> Joiner {
        Joiner {
            world_rank,
            epoch,
            state: State::Probe,
            outcome: None,
        }
    }

    /// The next action.
    pub(crate) fn poll(&mut self) -> JoinAction {
        match self.state {
            State::Probe => JoinAction::Probe,
            State::Announce => JoinAction::Announce,
            State::Watch { observe: true } => JoinAction::Observe,
            State::Watch { observe: false } => {
                self.state = State::Watch { observe: true };
                JoinAction::Wait(POLL)
            }
            State::Done => JoinAction::Done(self.outcome.clone().unwrap_or(JoinOutcome::Passed)),
        }
    }

    /// Whether the roster of this epoch already exists.
    pub(crate) fn probed(&mut self, exists: bool) {
        if self.state == State::Probe {
            if exists {
                self.done(JoinOutcome::Passed);
            } else {
                self.state = State::Announce;
            }
        }
    }

    /// This rank announced itself.
    pub(crate) fn announced(&mut self) {
        if self.state == State::Announce {
            self.state = State::Watch { observe: true };
        }
    }

    /// The roster of this epoch (if it exists), and whether the next
    /// epoch's roster exists.
    pub(crate) fn observed(&mut self, roster: Option<&[u8]>, next_exists: bool) {
        if !matches!(self.state, State::Watch { .. }) {
            return;
        }
        let Some(value) = roster else {
            if next_exists {
                self.done(JoinOutcome::Passed);
            } else {
                self.state = State::Watch { observe: false };
            }
            return;
        };
        let outcome = match Roster::decode(value) {
            Some(roster) if roster.epoch == self.epoch => match roster.joiner_rank(self.world_rank)
            {
                Some(rank) => JoinOutcome::Member { rank, roster },
                None => JoinOutcome::Passed,
            },
            _ => JoinOutcome::Corrupt {
                value: value.to_vec(),
            },
        };
        self.done(outcome);
    }

    fn done(&mut self, outcome: JoinOutcome) {
        self.outcome = Some(outcome);
        self.state = State::Done;
    }
}
