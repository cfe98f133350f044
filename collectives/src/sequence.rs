//! What every op of a group shares, whichever backend runs it: the group's
//! name, rank and size, its registry of in-flight ops, and the submission
//! lock under which an op takes its sequence number and reaches its
//! backend, so that program order is submission order even when several
//! threads submit.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chorus_core::flight_recorder::OpMeta;
use chorus_core::sync::lock;
use chorus_core::{DType, Op, OpContext, Registry, WorkError};

/// A group's identity, registry and sequence counters.
#[derive(Debug)]
pub(crate) struct Sequencer {
    name: Arc<str>,
    rank: usize,
    size: usize,
    registry: Arc<Registry>,
    counters: Mutex<Counters>,
    /// The group took in replacement ranks and refuses ops until `admit`
    /// returns it ([`take_admit_first`](Sequencer::take_admit_first)).
    admit_first: AtomicBool,
}

/// The sequence numbers a group has handed out.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Collective sequence number, equal on every rank for the same call.
    collective: u64,
    /// Number of messages sent to each peer.
    sent: Vec<u64>,
    /// Number of messages received from each peer.
    received: Vec<u64>,
    /// Ops chorus issued for itself (`admit`'s exchange), numbered apart
    /// so that they do not shift the program's sequence numbers.
    own: u64,
}

/// The sequence numbers the ops of one launch took ([`Counters::take`]),
/// as what their counters held before: a failed launch gives them back
/// ([`Counters::give_back`]) without a copy of every counter of the group.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// The collective number before the first collective took one.
    collective: Option<u64>,
    /// Each message counter moved, by (peer, sent or received): what it
    /// held before.
    messages: HashMap<(usize, bool), u64>,
}

impl Counters {
    /// The sequence number `op` (in group ranks) takes next: the group's
    /// next collective number, or the next message number between this
    /// rank and the peer in the op's direction (the n-th send from a to b
    /// matches the n-th recv on b from a).
    pub(crate) fn next(&self, op: Op) -> u64 {
        match op {
            Op::Send { peer } => self.sent[peer] + 1,
            Op::Recv { peer } => self.received[peer] + 1,
            Op::SendRecv { peer } => self.sent[peer].max(self.received[peer]) + 1,
            _ => self.collective + 1,
        }
    }

    /// Takes the sequence number `op` gets next (as [`next`](Self::next)
    /// then [`bump`](Self::bump)), noting in `taken` what the counter it
    /// moves held before, for [`give_back`](Self::give_back).
    pub(crate) fn take(&mut self, op: Op, taken: &mut Taken) -> u64 {
        match op {
            Op::Send { peer } | Op::Recv { peer } | Op::SendRecv { peer } => {
                let (sends, receives) = match op {
                    Op::Send { .. } => (true, false),
                    Op::Recv { .. } => (false, true),
                    _ => (true, true),
                };
                // The first value of each counter moved is the one to put
                // back (a group may hold many messages to one peer).
                if sends {
                    taken
                        .messages
                        .entry((peer, true))
                        .or_insert(self.sent[peer]);
                }
                if receives {
                    taken
                        .messages
                        .entry((peer, false))
                        .or_insert(self.received[peer]);
                }
            }
            _ => {
                taken.collective.get_or_insert(self.collective);
            }
        }
        let n = self.next(op);
        self.bump(op, n);
        n
    }

    /// Puts back every counter as it was before the numbers in `taken`
    /// were taken (the ops that took them never ran).
    pub(crate) fn give_back(&mut self, taken: Taken) {
        if let Some(c) = taken.collective {
            self.collective = c;
        }
        for ((peer, sent), before) in taken.messages {
            match sent {
                true => self.sent[peer] = before,
                false => self.received[peer] = before,
            }
        }
    }

    /// The context the next op chorus issues for itself (named `name`)
    /// takes on `seq`'s group: the next number among such ops, after the
    /// program's last collective (see [`OpContext`]).
    pub(crate) fn next_own(&self, seq: &Sequencer, name: &'static str) -> OpContext {
        OpContext {
            internal: std::num::NonZeroU64::new(self.own + 1),
            ..seq.ctx(self.collective, name)
        }
    }

    /// Records that an op of chorus's own took the number
    /// [`next_own`](Self::next_own) gave.
    pub(crate) fn bump_own(&mut self) {
        self.own += 1;
    }

    /// Records that `op` took `seq`.
    pub(crate) fn bump(&mut self, op: Op, seq: u64) {
        match op {
            Op::Send { peer } => self.sent[peer] = seq,
            Op::Recv { peer } => self.received[peer] = seq,
            Op::SendRecv { peer } => {
                self.sent[peer] = seq;
                self.received[peer] = seq;
            }
            _ => self.collective = seq,
        }
    }
}

impl Sequencer {
    /// The sequencer of rank `rank` in the group `name` of `size` ranks;
    /// `admit_first`: it refuses ops until `admit` returned the group.
    pub(crate) fn new(
        name: Arc<str>,
        rank: usize,
        size: usize,
        registry: Arc<Registry>,
        admit_first: bool,
    ) -> Self {
        Sequencer {
            name,
            rank,
            size,
            registry,
            admit_first: AtomicBool::new(admit_first),
            counters: Mutex::new(Counters {
                collective: 0,
                sent: vec![0; size],
                received: vec![0; size],
                own: 0,
            }),
        }
    }

    /// The group's name.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// This rank in the group.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// The group's size.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The group's registry of in-flight ops.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Takes the submission lock: hold it from taking a sequence number
    /// until the op is with its backend.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Counters> {
        lock(&self.counters)
    }

    /// Lets ops run on a group that refused them until `admit` returned it;
    /// whether it did refuse them (the first `admit` on such a group
    /// returns it at once).
    pub(crate) fn take_admit_first(&self) -> bool {
        self.admit_first.swap(false, Ordering::AcqRel)
    }

    /// Refuses every op while the group waits for `admit`
    /// ([`WorkError::NotAdmitted`]).
    fn check_admitted(&self, op: Op, name: &'static str) -> Result<(), WorkError> {
        if self.admit_first.load(Ordering::Acquire) {
            return Err(WorkError::NotAdmitted {
                ctx: self.refused_ctx(op, name),
            });
        }
        Ok(())
    }

    /// Where op `op` at `seq` sits, for its work and errors.
    pub(crate) fn ctx(&self, seq: u64, op: &'static str) -> OpContext {
        OpContext {
            rank: self.rank,
            group: self.name.clone(),
            seq,
            op,
            internal: None,
        }
    }

    /// Where `op` (named `name`) sits when it is refused: the sequence
    /// number it would have taken, which it does not take (the next op
    /// takes it), as a refusal by the registry
    /// ([`WorkError::GroupErrored`]) shows it. Takes the submission lock
    /// briefly: never call it while holding it.
    pub(crate) fn refused_ctx(&self, op: Op, name: &'static str) -> OpContext {
        let seq = match op {
            // A peer outside the group has no counter: no number.
            Op::Send { peer } | Op::Recv { peer } | Op::SendRecv { peer } if peer >= self.size => 0,
            _ => self.lock().next(op),
        };
        self.ctx(seq, name)
    }

    /// An invalid-argument error of `op` (named `name`): nothing was
    /// submitted; the context shows the number it would have taken
    /// ([`refused_ctx`](Self::refused_ctx)).
    pub(crate) fn invalid(&self, op: Op, name: &'static str, msg: String) -> WorkError {
        WorkError::InvalidArgument {
            ctx: self.refused_ctx(op, name),
            msg,
        }
    }

    /// Checks `op` (named `name`) on buffers of `counts` elements against
    /// the group: its shape rules ([`Op::check`]), and that a lone send or
    /// recv does not name this rank.
    ///
    /// # Errors
    ///
    /// [`WorkError::InvalidArgument`] saying what is wrong.
    pub(crate) fn check(
        &self,
        op: Op,
        name: &'static str,
        counts: &[usize],
    ) -> Result<(), WorkError> {
        self.check_admitted(op, name)?;
        op.check(self.size, counts)
            .map_err(|msg| self.invalid(op, name, msg))?;
        self.check_self(op, name)
    }

    /// Checks what only the group can tell of `op` (named `name`): a root
    /// or peer inside the group, and no lone send or recv to this rank. The
    /// shape rules are the GPU layer's to check, against the communicator
    /// that runs the op.
    ///
    /// # Errors
    ///
    /// [`WorkError::InvalidArgument`] saying what is wrong.
    pub(crate) fn check_ranks(&self, op: Op, name: &'static str) -> Result<(), WorkError> {
        self.check_admitted(op, name)?;
        match op.peer() {
            Some(r) if r >= self.size => {
                let what = if op.is_collective() { "root" } else { "peer" };
                Err(self.invalid(
                    op,
                    name,
                    format!("{what} {r} is not a rank of a group of size {}", self.size),
                ))
            }
            _ => self.check_self(op, name),
        }
    }

    /// Refuses a lone send or recv to this rank.
    fn check_self(&self, op: Op, name: &'static str) -> Result<(), WorkError> {
        match op {
            Op::Send { peer } | Op::Recv { peer } if peer == self.rank => {
                Err(self.invalid(op, name, format!("rank {peer} cannot {name} to itself")))
            }
            _ => Ok(()),
        }
    }

    /// What the flight recorder keeps of an op: its dtype, the element
    /// count of its (first) buffer, and its root or peer.
    pub(crate) fn meta(op: Op, dtype: Option<DType>, count: usize) -> OpMeta {
        OpMeta {
            dtype: dtype.map(|d| Cow::Borrowed(d.name())),
            count: count as u64,
            peer: op.peer(),
            internal: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_core::ReduceOp;

    fn counters() -> Counters {
        Counters {
            collective: 7,
            sent: vec![0, 3, 5],
            received: vec![0, 4, 6],
            own: 0,
        }
    }

    #[test]
    fn numbers_taken_follow_next_and_bump_and_are_given_back_whole() {
        let mut c = counters();
        let mut taken = Taken::default();
        let ops = [
            Op::AllReduce(ReduceOp::Sum),
            Op::Send { peer: 1 },
            Op::Recv { peer: 2 },
            Op::Broadcast { root: 0 },
            Op::Send { peer: 1 },
            Op::SendRecv { peer: 2 },
        ];
        let got: Vec<u64> = ops.iter().map(|&op| c.take(op, &mut taken)).collect();
        // Collectives count on; each pair's messages in its direction.
        assert_eq!(got, [8, 4, 7, 9, 5, 8]);
        assert_eq!(
            (c.collective, c.sent.clone(), c.received.clone()),
            (9, vec![0, 5, 8], vec![0, 4, 8])
        );
        // One note per counter moved, whatever the number of ops.
        assert_eq!(taken.messages.len(), 3);
        c.give_back(taken);
        let before = counters();
        assert_eq!(
            (c.collective, c.sent, c.received),
            (before.collective, before.sent, before.received)
        );
    }

    /// A refusal shows the number its op would have taken, on the op's own
    /// counter, and takes none; a peer outside the group has no counter.
    #[test]
    fn refusals_show_the_number_they_would_have_taken_and_take_none() {
        let seq = Sequencer::new("g".into(), 1, 3, Arc::new(Registry::new()), false);
        {
            let mut c = seq.lock();
            let mut taken = Taken::default();
            for op in [
                Op::AllReduce(ReduceOp::Sum),
                Op::Barrier,
                Op::Send { peer: 2 },
                Op::Recv { peer: 0 },
                Op::Recv { peer: 0 },
            ] {
                c.take(op, &mut taken);
            }
        }
        let seq_of = |e: WorkError| e.context().seq;
        // A collective: the group's next collective number.
        let e = seq.check(Op::Broadcast { root: 7 }, "broadcast", &[4]);
        assert_eq!(e.map_err(seq_of), Err(3));
        let e = seq.check(Op::AllGather, "all_gather", &[4, 5]);
        assert_eq!(e.map_err(seq_of), Err(3));
        // A send or recv: the next number towards or from its peer (here
        // a send to itself, refused).
        let e = seq.check(Op::Send { peer: 1 }, "send", &[1]).unwrap_err();
        assert_eq!(e.context().seq, 1, "{e}");
        assert!(
            e.to_string()
                .starts_with("rank 1 in group 'g' at seq 1 (send): "),
            "{e}"
        );
        let e = seq.invalid(Op::Recv { peer: 0 }, "recv", "no".into());
        assert_eq!(e.context().seq, 3);
        let e = seq.invalid(Op::Send { peer: 2 }, "send", "no".into());
        assert_eq!(e.context().seq, 2);
        // No counter for a peer outside the group: no number, none shown.
        let e = seq.check_ranks(Op::Recv { peer: 9 }, "recv").unwrap_err();
        assert_eq!(e.context().seq, 0);
        assert!(
            e.to_string()
                .starts_with("rank 1 in group 'g' (recv): invalid argument: "),
            "{e}"
        );
        // Nothing was taken.
        let c = seq.lock();
        assert_eq!(
            (c.collective, c.sent.clone(), c.received.clone()),
            (2, vec![0, 0, 1], vec![2, 0, 0])
        );
    }

    #[test]
    fn nothing_taken_gives_nothing_back() {
        let mut c = counters();
        c.give_back(Taken::default());
        assert_eq!(
            (c.collective, c.sent, c.received),
            (7, vec![0, 3, 5], vec![0, 4, 6])
        );
    }
}
