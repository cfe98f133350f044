//! [`Ring`], the I/O-free part of peer liveness: which peers this rank
//! watches, what its readings of them say, which verdicts it must publish,
//! and what the group's verdict log says (every call is given `now`).
//!
//! Each rank watches one peer: its predecessor on the ring of ranks,
//! skipping the peers that left and going on past those known silent (it
//! keeps watching those too, so that one that comes back is seen). A
//! watched peer whose counter has not moved for the liveness timeout is
//! judged silent by its watcher alone, which publishes the verdict in the
//! group's log; every rank reads the log, so every rank learns of the
//! silent peer one period later, at the cost of one counter read per
//! period. A rank that finds its predecessor silent then watches the next
//! live one, so a dead watcher and adjacent deaths are still found.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::marks::{LEFT, LOST};

/// What the readings say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No peer is known silent, and the store answers.
    Alive,
    /// `peer` (a group rank) has not beaten for `silent_for`.
    PeerSilent { peer: usize, silent_for: Duration },
    /// The store has not answered for `silent_for`; `cause` is its last
    /// error.
    StoreSilent { silent_for: Duration, cause: String },
}

/// One entry of the group's verdict log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The peer's beat stopped for the liveness timeout.
    Silent(usize),
    /// A peer once judged silent beats again.
    Alive(usize),
    /// A rank's search found the peer lost after its backend reported a
    /// failure that named no peer.
    Lost(usize),
}

impl Entry {
    /// The entry as stored.
    pub(crate) fn encode(self) -> String {
        match self {
            Entry::Silent(p) => format!("silent {p}"),
            Entry::Alive(p) => format!("alive {p}"),
            Entry::Lost(p) => format!("lost {p}"),
        }
    }

    /// An entry as stored; `None` for anything else.
    pub(crate) fn decode(raw: &[u8]) -> Option<Entry> {
        let s = std::str::from_utf8(raw).ok()?;
        let (what, peer) = s.trim().split_once(' ')?;
        let peer = peer.parse().ok()?;
        match what {
            "silent" => Some(Entry::Silent(peer)),
            "alive" => Some(Entry::Alive(peer)),
            "lost" => Some(Entry::Lost(peer)),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Watched {
    peer: usize,
    /// The counter as last read (`None` before the first reading).
    value: Option<i64>,
    /// When a reading last found it changed (or the watch began).
    changed: Instant,
}

/// This rank's part of the group's liveness: no I/O, no clock of its own.
#[derive(Debug)]
pub(crate) struct Ring {
    me: usize,
    size: usize,
    timeout: Duration,
    /// The peers watched now, nearest predecessor first: the silent ones
    /// skipped over, then one that is not known silent.
    watch: Vec<Watched>,
    /// Peers known silent (from the log or this rank's own judgement),
    /// with when this rank learnt it.
    silent: BTreeMap<usize, Instant>,
    /// Peers the log says were found lost, in the log's order.
    lost: Vec<usize>,
    /// Peers whose counters said they left.
    left: Vec<bool>,
    /// Log entries applied so far.
    cursor: u64,
    /// Log entries counted at the last reading.
    count: u64,
    /// Since when the entry after `cursor` is counted but missing.
    gap: Option<Instant>,
    /// Verdicts this rank must publish.
    posts: Vec<Entry>,
    /// When the store last answered, and its last error since.
    store_ok: Instant,
    store_error: Option<String>,
}

impl Ring {
    /// The ring of rank `me` of a group of `size`, started at `now`.
    pub(crate) fn new(me: usize, size: usize, timeout: Duration, now: Instant) -> Ring {
        let mut r = Ring {
            me,
            size,
            timeout,
            watch: Vec::new(),
            silent: BTreeMap::new(),
            lost: Vec::new(),
            left: vec![false; size],
            cursor: 0,
            count: 0,
            gap: None,
            posts: Vec::new(),
            store_ok: now,
            store_error: None,
        };
        r.rewatch(now);
        r
    }

    /// The peers a reading asks for, in order.
    pub(crate) fn watched(&self) -> Vec<usize> {
        self.watch.iter().map(|w| w.peer).collect()
    }

    /// Recomputes the watch set, keeping what was known of peers still in
    /// it; a peer new to it counts as just heard from at `now`.
    fn rewatch(&mut self, now: Instant) {
        let mut next = Vec::new();
        let mut p = self.me;
        for _ in 1..self.size {
            p = (p + self.size - 1) % self.size;
            if self.left[p] || self.lost.contains(&p) {
                continue;
            }
            let w = self
                .watch
                .iter()
                .find(|w| w.peer == p)
                .copied()
                .unwrap_or(Watched {
                    peer: p,
                    value: None,
                    changed: now,
                });
            next.push(w);
            if !self.silent.contains_key(&p) {
                break;
            }
        }
        self.watch = next;
    }

    /// A reading at `now`: `values[i]` is the counter of the `i`-th of
    /// [`watched`](Self::watched) (`None`: not readable), `count` the
    /// number of entries in the verdict log.
    pub(crate) fn read(&mut self, values: &[Option<i64>], count: u64, now: Instant) {
        self.store_ok = now;
        self.store_error = None;
        let mut changed_set = false;
        for (i, &v) in values.iter().enumerate().take(self.watch.len()) {
            let peer = self.watch[i].peer;
            if v.is_some_and(|v| v >= LOST) {
                if !self.lost.contains(&peer) {
                    self.lost.push(peer);
                }
                changed_set = true;
                continue;
            }
            if v.is_some_and(|v| v >= LEFT) {
                self.left[peer] = true;
                changed_set = true;
                continue;
            }
            let w = &mut self.watch[i];
            if v.is_some() && w.value != v {
                let first = w.value.is_none();
                w.value = v;
                w.changed = now;
                if !first && self.silent.remove(&peer).is_some() {
                    self.posts.push(Entry::Alive(peer));
                    changed_set = true;
                }
            } else if now.saturating_duration_since(w.changed) >= self.timeout
                && !self.silent.contains_key(&peer)
            {
                // (An unreadable value is no beat either.)
                self.silent.insert(peer, w.changed);
                self.posts.push(Entry::Silent(peer));
                changed_set = true;
            }
        }
        if count <= self.cursor {
            self.gap = None;
        }
        self.count = count.max(self.count);
        if changed_set {
            self.rewatch(now);
        }
    }

    /// The log entries to read next (numbered from 1), if any.
    pub(crate) fn unread(&self) -> Option<std::ops::RangeInclusive<u64>> {
        (self.count > self.cursor).then(|| self.cursor + 1..=self.count)
    }

    /// Entries read from the log, in order from the first of
    /// [`unread`](Self::unread) (an entry that does not decode is skipped).
    pub(crate) fn log_read(&mut self, entries: &[Option<Entry>], now: Instant) {
        for e in entries {
            self.cursor += 1;
            self.gap = None;
            match *e {
                Some(Entry::Silent(p)) if p != self.me && p < self.size => {
                    // Its watcher saw it still for the timeout.
                    let since = now.checked_sub(self.timeout).unwrap_or(now);
                    self.silent.entry(p).or_insert(since);
                }
                Some(Entry::Alive(p)) => {
                    self.silent.remove(&p);
                }
                Some(Entry::Lost(p))
                    if p != self.me && p < self.size && !self.lost.contains(&p) =>
                {
                    self.lost.push(p);
                }
                _ => {}
            }
        }
        self.rewatch(now);
    }

    /// The unread entries could not all be read at `now` (counted but not
    /// written yet). One that stays missing for the timeout (its writer
    /// died between counting and writing it) is skipped.
    pub(crate) fn log_missing(&mut self, now: Instant) {
        let since = *self.gap.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.timeout && self.count > self.cursor {
            self.cursor += 1;
            self.gap = None;
        }
    }

    /// The verdicts this rank must publish, taken (the caller appends them
    /// to the log; one it fails to append is given back with
    /// [`repost`](Self::repost)).
    pub(crate) fn take_posts(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.posts)
    }

    /// A verdict that could not be appended, to try again next round.
    pub(crate) fn repost(&mut self, e: Entry) {
        self.posts.push(e);
    }

    /// The store failed to answer, with `cause`.
    pub(crate) fn store_failed(&mut self, cause: String) {
        self.store_error = Some(cause);
    }

    /// Peers found lost by a rank's search, in the log's order (or marked
    /// so on a watched counter).
    pub(crate) fn lost(&self) -> &[usize] {
        &self.lost
    }

    /// The verdict at `now`: the store's silence first (it makes every
    /// peer look silent), then the peer known silent longest.
    pub(crate) fn verdict(&self, now: Instant) -> Verdict {
        let store_silent = now.saturating_duration_since(self.store_ok);
        if store_silent >= self.timeout {
            return Verdict::StoreSilent {
                silent_for: store_silent,
                cause: self
                    .store_error
                    .clone()
                    .unwrap_or_else(|| "no answer".into()),
            };
        }
        self.silent
            .iter()
            .filter(|(p, _)| !self.left[**p])
            .min_by_key(|(_, &since)| since)
            .map_or(Verdict::Alive, |(&peer, &since)| Verdict::PeerSilent {
                peer,
                silent_for: now.saturating_duration_since(since),
            })
    }
}
