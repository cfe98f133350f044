//! A group's board in shared memory (see `board`): the mapping, its
//! layout, the futex on its `done` word and the look at a peer's process.
//! With `shm`, the only `unsafe` of the TCP backend.
//!
//! # Layout
//!
//! One 4 KiB header page, then two *areas* per rank (area `2·rank +
//! parity`), each a 64-byte area header and [`BOARD_BYTES`] of payload:
//!
//! | offset | header page                                   |
//! |--------|-----------------------------------------------|
//! | 0      | magic (`CHRCBRD1`)                            |
//! | 8      | ranks                                         |
//! | 16     | payload bytes per area                        |
//! | 24     | nonce (the creator's random number)           |
//! | 64     | `arrived` (u64), its own cache line           |
//! | 128    | `done` (u32, the futex word), its own line    |
//! | 192    | `sleepers` (u32), its own line                |
//!
//! | offset | area header                                   |
//! |--------|-----------------------------------------------|
//! | 0      | stamp: `k + 1` of the op last written (u64)   |
//! | 8      | the op's signature ([`SIG_LEN`] bytes)        |
//! | 32     | payload length (u64)                          |
//! | 40     | the writer's process id (u32; parity 0 only)  |
//!
//! The creator (rank 0) makes an anonymous `memfd`, sized and sealed
//! against resizing (a peer can never make a mapping fault), and
//! publishes its process id, descriptor number and nonce; every other
//! rank opens it through `/proc/<pid>/fd/<fd>`, which only a process of
//! the same host (and process namespace) can, and checks the layout and
//! the nonce (a process of another host with the same id and descriptor
//! number holds another file). Nothing has a name in `/dev/shm`: the
//! memory goes with the last mapping, even after SIGKILL. The memfd and
//! the mapping are `shm`'s (`sealed_memfd`, `map_sealed`).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

use chorus_core::board::Words;

use super::shm::{map_sealed, sealed_memfd};

/// Payload bytes of one area: the largest small op that runs on the board.
pub(super) const BOARD_BYTES: usize = 4096;
/// Bytes of an op's signature in an area header.
pub(super) const SIG_LEN: usize = 24;

const PAGE: usize = 4096;
const AREA_HDR: usize = 64;
const MAGIC: u64 = 0x3144_5242_4352_4843;
const ARRIVED: usize = 64;
const DONE: usize = 128;
const SLEEPERS: usize = 192;
const STAMP: usize = 0;
const SIG: usize = 8;
const LEN: usize = 32;
const PID: usize = 40;

fn area_bytes(payload: usize) -> usize {
    AREA_HDR + payload.div_ceil(64) * 64
}

fn board_len(n: usize, payload: usize) -> usize {
    PAGE + 2 * n * area_bytes(payload)
}

/// One rank's mapping of a board.
pub(super) struct BoardMap {
    base: *mut u8,
    len: usize,
    n: usize,
    payload: usize,
}

impl std::fmt::Debug for BoardMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoardMap")
            .field("ranks", &self.n)
            .field("payload", &self.payload)
            .finish()
    }
}

// SAFETY: the mapping is plain shared memory owned by the `BoardMap` until
// it is dropped; the shared words are only touched atomically and the
// areas under the board protocol (`chorus_core::board`).
unsafe impl Send for BoardMap {}
// SAFETY: see `Send`.
unsafe impl Sync for BoardMap {}

impl Drop for BoardMap {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what `mmap` returned in `map`,
        // unmapped only here; every borrow of the board ends with `self`.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// What peers need to open a board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Published {
    pub(super) pid: u32,
    pub(super) fd: i32,
    pub(super) nonce: u64,
}

impl Published {
    /// The text published in the store.
    pub(super) fn to_text(self) -> String {
        format!("{} {} {:x}", self.pid, self.fd, self.nonce)
    }

    /// Parses [`to_text`](Self::to_text).
    pub(super) fn parse(s: &str) -> Option<Published> {
        let mut it = s.split(' ');
        let p = Published {
            pid: it.next()?.parse().ok()?,
            fd: it.next()?.parse().ok()?,
            nonce: u64::from_str_radix(it.next()?, 16).ok()?,
        };
        it.next().is_none().then_some(p)
    }
}

impl BoardMap {
    /// Creates the board of `n` ranks: returns its mapping, its
    /// descriptor (keep it open until every peer opened it) and what to
    /// publish.
    pub(super) fn create(n: usize) -> Result<(BoardMap, OwnedFd, Published), String> {
        let len = board_len(n, BOARD_BYTES);
        let (fd, file) = sealed_memfd(c"chorus-tcp-board", len)?;
        let nonce = nonce();
        let mut hdr = [0u8; 32];
        hdr[0..8].copy_from_slice(&MAGIC.to_ne_bytes());
        hdr[8..16].copy_from_slice(&(n as u64).to_ne_bytes());
        hdr[16..24].copy_from_slice(&(BOARD_BYTES as u64).to_ne_bytes());
        hdr[24..32].copy_from_slice(&nonce.to_ne_bytes());
        std::os::unix::fs::FileExt::write_all_at(&file, &hdr, 0)
            .map_err(|e| format!("cannot write the board's header: {e}"))?;
        let map = BoardMap::map(&fd, n, nonce)?;
        let published = Published {
            pid: std::process::id(),
            fd: fd.as_raw_fd(),
            nonce,
        };
        Ok((map, fd, published))
    }

    /// Opens the board `p` of `n` ranks that a process of this host
    /// created.
    pub(super) fn open(p: Published, n: usize) -> Result<BoardMap, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = format!("/proc/{}/fd/{}", p.pid, p.fd);
        // On another host the same process id and descriptor may name
        // anything: open it without blocking or taking a terminal, and
        // map only a regular file of the board's size, seals and nonce.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
            .map_err(|e| format!("cannot open {path}: {e}"))?;
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Err(format!("{path} is not a board"));
        }
        BoardMap::map(&OwnedFd::from(file), n, p.nonce)
    }

    /// Maps `fd` and checks that it is the board of `n` ranks with
    /// `nonce`.
    fn map(fd: &OwnedFd, n: usize, nonce: u64) -> Result<BoardMap, String> {
        let len = board_len(n, BOARD_BYTES);
        let base = map_sealed(fd, len, &format!("board of {n} ranks"))?;
        let map = BoardMap {
            base,
            len,
            n,
            payload: BOARD_BYTES,
        };
        // SAFETY: offsets 0..32 are in the header page, written once by
        // the creator before it published the board.
        let (magic, rn, rb, rnonce) = unsafe {
            (
                map.base.cast::<u64>().read_unaligned(),
                map.base.add(8).cast::<u64>().read_unaligned(),
                map.base.add(16).cast::<u64>().read_unaligned(),
                map.base.add(24).cast::<u64>().read_unaligned(),
            )
        };
        if magic != MAGIC || rn != n as u64 || rb != BOARD_BYTES as u64 || rnonce != nonce {
            return Err(format!(
                "not this group's board (magic {magic:#x}, {rn} ranks, {rb} bytes, nonce {rnonce:x}; expected {n} ranks, {BOARD_BYTES} bytes, nonce {nonce:x})"
            ));
        }
        Ok(map)
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: every offset passed here is 8-byte aligned inside the
        // page-aligned mapping of `len` bytes (the layout's constants and
        // `area`); the word is only ever accessed atomically, by every
        // process, while `self` (the mapping) lives.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: as `u64_at`, 4-byte aligned.
        unsafe { &*self.base.add(off).cast::<AtomicU32>() }
    }

    /// Offset of the area of `rank` for ops of `parity`.
    fn area(&self, rank: usize, parity: usize) -> usize {
        debug_assert!(rank < self.n && parity < 2);
        PAGE + (2 * rank + parity) * area_bytes(self.payload)
    }

    /// The protocol's shared words.
    pub(super) fn words(&self) -> Words<'_> {
        Words {
            arrived: self.u64_at(ARRIVED),
            done: self.u32_at(DONE),
            sleepers: self.u32_at(SLEEPERS),
        }
    }

    /// The stamp of `rank`'s area of `parity`: `k + 1` of the op last
    /// written there.
    pub(super) fn stamp(&self, rank: usize, parity: usize) -> &AtomicU64 {
        self.u64_at(self.area(rank, parity) + STAMP)
    }

    /// The process id `rank` wrote when it opened the board.
    pub(super) fn pid(&self, rank: usize) -> &AtomicU32 {
        self.u32_at(self.area(rank, 0) + PID)
    }

    /// Writes this rank's part of an op into its area of `parity`: the
    /// op's signature and `payload` (at most [`BOARD_BYTES`]). Only the
    /// owner of the area calls it, and only while the protocol says no
    /// one reads it.
    pub(super) fn put(&self, rank: usize, parity: usize, sig: &[u8; SIG_LEN], payload: &[u8]) {
        let len = payload.len().min(self.payload);
        let at = self.area(rank, parity);
        // SAFETY: `at + AREA_HDR + len <= len_of_mapping` (the area lies in
        // the mapping and `len` is at most its payload); the signature
        // and length fields lie in the area header. No one reads this
        // area now (the board protocol), so nothing else touches it.
        unsafe {
            std::ptr::copy_nonoverlapping(sig.as_ptr(), self.base.add(at + SIG), SIG_LEN);
            self.base
                .add(at + LEN)
                .cast::<u64>()
                .write_unaligned(len as u64);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), self.base.add(at + AREA_HDR), len);
        }
    }

    /// Reads `rank`'s area of `parity`: its signature and payload (its
    /// length as written, but never beyond the area). Only while the
    /// protocol says its writer does not write it.
    pub(super) fn get(&self, rank: usize, parity: usize) -> ([u8; SIG_LEN], &[u8]) {
        let at = self.area(rank, parity);
        let mut sig = [0u8; SIG_LEN];
        // SAFETY: the fields and the payload lie inside the area (the
        // length is clamped to it); the writer does not write the area
        // while the protocol lets this rank read it, so the bytes do not
        // change under the returned slice while `self` is borrowed for
        // this op.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(at + SIG), sig.as_mut_ptr(), SIG_LEN);
            let len =
                (self.base.add(at + LEN).cast::<u64>().read_unaligned() as usize).min(self.payload);
            (
                sig,
                std::slice::from_raw_parts(self.base.add(at + AREA_HDR), len),
            )
        }
    }

    /// Blocks this thread while `done` holds `seen`, at most `timeout`
    /// (a futex: the kernel compares the word and sleeps as one step).
    pub(super) fn wait_done(&self, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a 4-byte aligned word of a shared mapping
        // that outlives the call, with a valid relative timeout; the
        // result (woken, timed out, value changed, interrupted) needs no
        // handling: the caller looks at the word again.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.words().done.as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes every thread (of any process) blocked in
    /// [`wait_done`](Self::wait_done).
    pub(super) fn wake_done(&self) {
        // SAFETY: FUTEX_WAKE on a 4-byte aligned word of a shared mapping
        // that outlives the call; it touches no memory.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.words().done.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// Whether process `pid` of this host still exists.
pub(super) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing: it only asks whether the process
    // exists (and may be signalled).
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A random number for a board's nonce.
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
