//! How far a communicator's stream is known to have run.
//!
//! End events recorded on one stream complete in stream order, so an op
//! whose position on the stream is at or below one known to have ended has
//! ended too, with no query of its own. [`StreamProgress`] keeps that mark
//! (raised by whoever sees an op end) and the newest op's end event: when
//! an awaited op is found ended at its first look, the host is behind the
//! GPU, and one query of the newest op's end event usually tells that the
//! whole stream ran dry, so that the ops awaited after it (a loop awaiting
//! the gradient buckets it submitted) need no query at all. Found still
//! running, the newest is asked again only once [`ASK_AGAIN_AFTER`] more
//! ops were seen to end by their own queries, so a host that is behind
//! pays at most one extra query for that many of its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::event_pool::EndEvent;
use chorus_core::sync::lock;

/// What [`StreamProgress`] asks about the newest op: whether its end event
/// completed (its device is current on the calling thread).
pub(super) trait Ended {
    fn has_ended(&self) -> bool;
}

impl Ended for Arc<EndEvent> {
    fn has_ended(&self) -> bool {
        matches!(self.is_complete(), Ok(true))
    }
}

/// Ops seen to end by their own queries before a newest op found running
/// is asked again.
pub(super) const ASK_AGAIN_AFTER: u64 = 4;

/// The newest op enqueued on the stream.
struct Newest<E> {
    pos: u64,
    end: E,
    /// Found running when the mark stood here: asked again once the mark
    /// passed it by [`ASK_AGAIN_AFTER`].
    asked_at: Option<u64>,
}

/// How far one communicator stream is known to have run (see the module
/// docs). Positions are the stream's op numbers, from 1.
pub(super) struct StreamProgress<E = Arc<EndEvent>> {
    /// Every op at or below this position is known to have ended.
    through: AtomicU64,
    newest: Mutex<Option<Newest<E>>>,
}

impl<E> Default for StreamProgress<E> {
    fn default() -> Self {
        StreamProgress {
            through: AtomicU64::new(0),
            newest: Mutex::new(None),
        }
    }
}

static KNOWN_WITHOUT_QUERY: AtomicU64 = AtomicU64::new(0);

/// How many awaited ops were known to have ended from the stream's
/// progress, with no query of their own (process-wide).
#[cfg(feature = "test-util")]
pub fn ended_without_query() -> u64 {
    KNOWN_WITHOUT_QUERY.load(Ordering::Relaxed)
}

impl<E: Ended + Clone> StreamProgress<E> {
    /// True if the op at `pos` is known to have ended.
    pub(super) fn ended(&self, pos: u64) -> bool {
        pos != 0 && self.through.load(Ordering::Acquire) >= pos
    }

    /// [`ended`](Self::ended), counted as an op known to have ended without
    /// a query when it is.
    pub(super) fn known(&self, pos: u64) -> bool {
        let known = self.ended(pos);
        if known {
            KNOWN_WITHOUT_QUERY.fetch_add(1, Ordering::Relaxed);
        }
        known
    }

    /// The op at `pos` was seen to have ended (and with it every op
    /// before it).
    pub(super) fn saw_ended(&self, pos: u64) {
        self.through.fetch_max(pos, Ordering::AcqRel);
    }

    /// The op at `pos`, whose end event is `end`, was recorded on the
    /// stream (called in stream order, under the communicator's enqueue
    /// lock; never for an op captured into a graph).
    pub(super) fn recorded(&self, pos: u64, end: &E) {
        let old = lock(&self.newest).replace(Newest {
            pos,
            end: end.clone(),
            asked_at: None,
        });
        // Dropped outside the lock.
        drop(old);
    }

    /// The op at `pos` was found ended at its first look: asks the newest
    /// op's end event whether the stream ran dry, and raises the mark to it
    /// if so (a newest op found running is asked again only after
    /// [`ASK_AGAIN_AFTER`] more ops were seen to end).
    pub(super) fn catch_up(&self, pos: u64) {
        let through = self.through.load(Ordering::Acquire);
        let (newest, end) = {
            let g = lock(&self.newest);
            match g.as_ref() {
                Some(n)
                    if n.pos > pos
                        && n.pos > through
                        && n.asked_at.is_none_or(|at| through >= at + ASK_AGAIN_AFTER) =>
                {
                    (n.pos, n.end.clone())
                }
                _ => return,
            }
        };
        if end.has_ended() {
            self.saw_ended(newest);
            return;
        }
        let mut g = lock(&self.newest);
        if let Some(n) = g.as_mut().filter(|n| n.pos == newest) {
            n.asked_at = Some(through);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A fake end event: ended once the shared "GPU" has passed `pos`;
    /// counts the queries.
    #[derive(Clone)]
    struct Fake {
        pos: u64,
        gpu: Arc<AtomicU64>,
        queries: Arc<AtomicUsize>,
    }

    impl Ended for Fake {
        fn has_ended(&self) -> bool {
            self.queries.fetch_add(1, Ordering::SeqCst);
            self.gpu.load(Ordering::SeqCst) >= self.pos
        }
    }

    fn stream(n: u64) -> (StreamProgress<Fake>, Arc<AtomicU64>, Arc<AtomicUsize>) {
        let p = StreamProgress::default();
        let gpu = Arc::new(AtomicU64::new(0));
        let queries = Arc::new(AtomicUsize::new(0));
        for pos in 1..=n {
            p.recorded(
                pos,
                &Fake {
                    pos,
                    gpu: gpu.clone(),
                    queries: queries.clone(),
                },
            );
        }
        (p, gpu, queries)
    }

    #[test]
    fn nothing_is_known_before_an_op_is_seen_to_end() {
        let (p, _, _) = stream(4);
        assert!(!p.ended(0), "position 0 is no op");
        assert!(!p.ended(1));
        p.saw_ended(3);
        assert!(
            p.ended(1) && p.ended(3),
            "an op vouches for those before it"
        );
        assert!(!p.ended(4));
        p.saw_ended(2);
        assert!(p.ended(3), "the mark never goes back");
    }

    #[test]
    fn a_stream_that_ran_dry_is_learned_with_one_query() {
        let (p, gpu, queries) = stream(16);
        gpu.store(16, Ordering::SeqCst);
        // Op 1 found ended at its first look: the newest is asked.
        p.saw_ended(1);
        p.catch_up(1);
        assert_eq!(queries.load(Ordering::SeqCst), 1);
        assert!(
            (2..=16).all(|pos| p.known(pos)),
            "every later op is known to have ended"
        );
        // Nothing left to ask.
        p.catch_up(2);
        assert_eq!(queries.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_newest_op_still_running_is_asked_again_only_after_more_ops_ended() {
        let (p, gpu, queries) = stream(8);
        gpu.store(3, Ordering::SeqCst);
        for pos in 1..=3 {
            p.saw_ended(pos);
            p.catch_up(pos);
        }
        let asked = || queries.load(Ordering::SeqCst);
        assert_eq!(asked(), 1, "asked once, found running");
        assert!(!p.ended(4), "a running op is never taken as ended");
        // The GPU moves on; each op ends by its own query until enough of
        // them did to ask the newest again.
        gpu.store(8, Ordering::SeqCst);
        for pos in 4..ASK_AGAIN_AFTER + 1 {
            p.saw_ended(pos);
            p.catch_up(pos);
        }
        assert_eq!(asked(), 1, "not asked again before the mark moved on");
        p.saw_ended(ASK_AGAIN_AFTER + 1);
        p.catch_up(ASK_AGAIN_AFTER + 1);
        assert_eq!(asked(), 2, "asked again once it did");
        assert!(p.ended(8), "the stream ran dry");
        // A newer op is asked about afresh.
        p.recorded(
            9,
            &Fake {
                pos: 9,
                gpu: gpu.clone(),
                queries: queries.clone(),
            },
        );
        gpu.store(9, Ordering::SeqCst);
        p.catch_up(8);
        assert_eq!(asked(), 3);
        assert!(p.ended(9));
    }

    #[test]
    fn an_op_newer_than_the_one_asking_is_needed() {
        let (p, _, queries) = stream(5);
        p.catch_up(5);
        p.catch_up(7);
        assert_eq!(
            queries.load(Ordering::SeqCst),
            0,
            "no newer op to ask about"
        );
    }
}
