//! Shared-memory data plane for peers on this host: with `shm_board` (the
//! group's board), every `unsafe` of the TCP backend lives here (memfd,
//! `mmap`, passing a descriptor over a Unix socket, raw slot access, the
//! streaming stores of [`copy_out`]).
//!
//! # Design
//!
//! The socket stays the control plane. For each ordered pair of ranks that
//! talk through a Unix socket (same host and network namespace) and both
//! have [`TcpOptions::shared_memory`](super::TcpOptions::shared_memory) on,
//! the *sender* creates one **segment**: an anonymous `memfd` (never a name
//! in `/dev/shm`, so nothing can be left behind, even after SIGKILL: the
//! memory goes away with the last process that maps it), sealed against
//! shrinking and growing (so a peer can never make a mapping fault), and
//! passes the descriptor to the receiver over the Unix socket
//! (`SCM_RIGHTS`) during setup. The receiver maps it, checks its layout and
//! answers whether it did; the sender only uses a segment the receiver
//! acknowledged.
//!
//! A segment is one 4 KiB header page followed by [`slot_count`] slots of
//! `chunk_bytes` (rounded up to whole pages): 32 slots, or fewer when that
//! would exceed 8 MiB per direction (at least 2). Each slot has a state
//! word in the header page (its own cache line): `FREE` (0) or `FULL` (the
//! number of readers that have not read it yet: 1 in a pair's segment).
//! Only the sender turns `FREE` into `FULL` (after writing the payload,
//! with release ordering), only the receivers count it down to `FREE`
//! (after their last read, with release ordering), so a slot is written
//! only while no one reads it.
//!
//! Each rank also has one **broadcast segment** of the same layout, whose
//! descriptor goes to every local peer with the pair's: a slot there is
//! written once and read by several peers (the all-gather phase of an
//! all_reduce whose ranks are all on this host; see the module docs of
//! [`tcp`](super)).
//!
//! A frame whose payload is at least [`SHM_MIN`] bytes goes to a peer with a
//! segment like this: the sender copies the payload into the lowest free
//! slot, marks it `FULL`, and sends only the frame header over the socket,
//! with the slot number in it. The receiver's reader checks that the slot is
//! `FULL` and queues a frame whose payload *is* the slot; the worker checks
//! the header as usual and then reduces or copies straight from the slot
//! into the op's buffer; dropping the frame frees the slot. The ring's
//! reduce-scatter reserves a slot of the next rank ([`Tx::reserve`]) and
//! reduces a received partial sum straight into it.
//!
//! A sender that finds every slot in use does not wait: it sends that
//! frame's payload through the socket, as without shared memory. So this
//! data plane adds no wait of its own: ordering, header checks, timeouts
//! and peer-death detection are the socket's, unchanged. A peer that dies
//! leaves its slots `FULL`; the survivor notices the closed socket as
//! before, and its mapping stays valid until it drops it.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use chorus_core::pipe::{self, Wake, Words};

/// Bit of a frame header's `shm` field: the slot is in the sender's
/// broadcast segment (else in the pair's segment).
pub(super) const BCAST_BIT: u16 = 0x8000;

/// Frames with at least this many payload bytes go through shared memory
/// when the peer has a segment. Smaller frames are mostly header and
/// system-call cost: one `write` of header and payload together is as
/// cheap as writing the header alone.
pub(super) const SHM_MIN: usize = 16 << 10;
/// Largest `chunk_bytes` with which shared memory is used.
pub(super) const SHM_MAX_CHUNK: usize = 16 << 20;
/// Most slots per direction (at most 64: [`Tx`] keeps a bit mask).
const MAX_SLOTS: usize = 32;
/// Target size of a segment's slots together.
const SEGMENT_BUDGET: usize = 8 << 20;
/// Size of the header page.
const PAGE: usize = 4096;
/// First bytes of a segment ("CHRCSHM2": with a pipe).
const SEG_MAGIC: u64 = 0x3248_4d53_4352_4843;
/// Bytes of a segment's pipe (after the header page, before the slots).
pub(super) const PIPE_BYTES: usize = 1 << 20;
/// Offsets of the pipe's four words in the header page, after the slot
/// state words, one cache line each: `head`, `tail`, `reader_asleep`,
/// `writer_asleep` (see `chorus_core::pipe`).
const PIPE_WORDS: [usize; 4] = [
    64 + 64 * MAX_SLOTS,
    128 + 64 * MAX_SLOTS,
    192 + 64 * MAX_SLOTS,
    256 + 64 * MAX_SLOTS,
];
/// Offset of slot `i`'s state word: one cache line each, after 64 bytes of
/// layout fields.
const fn state_off(i: usize) -> usize {
    64 + 64 * i
}

const FREE: u32 = 0;

/// Offset of the first slot: after the header page and the pipe.
const SLOTS_AT: usize = PAGE + PIPE_BYTES;

/// Slots per direction for a chunk size.
pub(super) fn slot_count(chunk_bytes: usize) -> usize {
    (SEGMENT_BUDGET / slot_bytes(chunk_bytes)).clamp(2, MAX_SLOTS)
}

/// Bytes of one slot: the chunk size rounded up to whole pages.
fn slot_bytes(chunk_bytes: usize) -> usize {
    chunk_bytes.max(1).div_ceil(PAGE) * PAGE
}

/// Creates an anonymous `memfd` named `name` of `len` bytes (zero-filled),
/// sealed against shrinking and growing, so that no mapping of it can
/// ever fault; returns it and a `File` on it for writing a header.
#[cfg(target_os = "linux")]
pub(super) fn sealed_memfd(
    name: &std::ffi::CStr,
    len: usize,
) -> Result<(std::os::fd::OwnedFd, std::fs::File), String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: `name` is NUL-terminated; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(format!(
            "memfd_create failed: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let file = std::fs::File::from(
        fd.try_clone()
            .map_err(|e| format!("cannot duplicate the memfd: {e}"))?,
    );
    file.set_len(len as u64)
        .map_err(|e| format!("cannot size the memfd to {len} bytes: {e}"))?;
    // SAFETY: plain fcntl on a descriptor we own.
    let r = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    };
    if r < 0 {
        return Err(format!(
            "cannot seal the memfd: {}",
            io::Error::last_os_error()
        ));
    }
    Ok((fd, file))
}

/// Maps all of `fd` shared and read/write, once it is found to be exactly
/// `len` bytes long and sealed against resizing (so every page of the
/// mapping stays backed); `what` names it in errors. The caller owns the
/// mapping and unmaps it (`munmap` of the pointer and `len`).
#[cfg(target_os = "linux")]
pub(super) fn map_sealed(
    fd: &std::os::fd::OwnedFd,
    len: usize,
    what: &str,
) -> Result<*mut u8, String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::from(
        fd.try_clone()
            .map_err(|e| format!("cannot duplicate the {what}'s descriptor: {e}"))?,
    );
    let actual = file
        .metadata()
        .map_err(|e| format!("cannot stat the {what}: {e}"))?
        .len();
    if actual != len as u64 {
        return Err(format!("{what} of {actual} bytes, expected {len}"));
    }
    // SAFETY: plain fcntl query on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals < 0 || seals & need != need {
        return Err(format!("{what} is not sealed against resizing"));
    }
    // SAFETY: a fresh shared mapping of `len` bytes of a file that is
    // exactly `len` bytes long and sealed against shrinking, so every page
    // of the mapping stays backed (no SIGBUS). The result is checked for
    // MAP_FAILED.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mmap failed: {}", io::Error::last_os_error()));
    }
    Ok(base.cast())
}

/// One mapped segment (either end).
pub(super) struct Segment {
    base: *mut u8,
    len: usize,
    slots: usize,
    slot_bytes: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("slots", &self.slots)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

// SAFETY: the mapping is plain shared memory owned by the `Segment` until it
// is dropped; all access goes through the atomic state words and the slot
// ownership protocol in the module docs, never through unsynchronized
// shared Rust references.
unsafe impl Send for Segment {}
// SAFETY: see `Send`: `&Segment` only hands out atomics and slot pointers
// whose use is governed by the slot protocol.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the region `mmap` returned in
        // `Segment::map_fd`, mapped once and unmapped only here; every
        // `Slot` and `Tx` holds the segment alive while it uses it.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

impl Segment {
    fn state(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.slots);
        // SAFETY: `state_off(i) < PAGE <= len` for `i < MAX_SLOTS` and the
        // mapping is page aligned, so the pointer is in bounds and 4-byte
        // aligned; the word is only ever accessed atomically, by both
        // processes, for as long as `self` (the mapping) lives.
        unsafe { &*self.base.add(state_off(i)).cast::<AtomicU32>() }
    }

    fn slot_ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.slots);
        // SAFETY: `SLOTS_AT + i * slot_bytes + slot_bytes <= len` for
        // `i < slots` (checked when mapping), so the result is in bounds.
        unsafe { self.base.add(SLOTS_AT + i * self.slot_bytes) }
    }

    /// The pipe's shared words.
    fn pipe_words(&self) -> Words<'_> {
        // SAFETY: every `PIPE_WORDS` offset is below `PAGE <= len`
        // (`256 + 64 * MAX_SLOTS + 8 <= 4096`) and 8-byte aligned in the
        // page-aligned mapping; the words are only ever accessed
        // atomically, by both processes, while `self` (the mapping) lives.
        let word64 = |off: usize| unsafe { &*self.base.add(off).cast::<AtomicU64>() };
        // SAFETY: as above, 4-byte aligned.
        let word32 = |off: usize| unsafe { &*self.base.add(off).cast::<AtomicU32>() };
        Words {
            head: word64(PIPE_WORDS[0]),
            tail: word64(PIPE_WORDS[1]),
            reader_asleep: word32(PIPE_WORDS[2]),
            writer_asleep: word32(PIPE_WORDS[3]),
        }
    }

    /// The pipe's ring: `PIPE_BYTES` after the header page.
    fn pipe_ptr(&self) -> *mut u8 {
        // SAFETY: `PAGE + PIPE_BYTES = SLOTS_AT <= len`, so the ring is in
        // bounds.
        unsafe { self.base.add(PAGE) }
    }

    /// Maps `fd` (read/write, shared) and checks its layout against what
    /// this rank expects for `chunk_bytes`.
    #[cfg(target_os = "linux")]
    fn map_fd(fd: &std::os::fd::OwnedFd, chunk_bytes: usize) -> Result<Segment, String> {
        let slots = slot_count(chunk_bytes);
        let sb = slot_bytes(chunk_bytes);
        let len = SLOTS_AT + slots * sb;
        let base = map_sealed(fd, len, "segment (different chunk_bytes?)")?;
        let seg = Segment {
            base,
            len,
            slots,
            slot_bytes: sb,
        };
        // SAFETY: offsets 0..24 are in the header page; the fields are
        // written once by the creator before the descriptor is sent, and
        // read here unaligned-safe with `read_unaligned`.
        let (magic, s, b) = unsafe {
            (
                seg.base.cast::<u64>().read_unaligned(),
                seg.base.add(8).cast::<u64>().read_unaligned(),
                seg.base.add(16).cast::<u64>().read_unaligned(),
            )
        };
        if magic != SEG_MAGIC || s != slots as u64 || b != sb as u64 {
            return Err(format!(
                "segment layout ({s} slots of {b} bytes, magic {magic:#x}) differs from this rank's ({slots} of {sb})"
            ));
        }
        Ok(seg)
    }

    /// Creates, sizes, seals and maps a new segment for `chunk_bytes`;
    /// returns it and its descriptor (to send to the receiver).
    #[cfg(target_os = "linux")]
    fn create(chunk_bytes: usize) -> Result<(Segment, std::os::fd::OwnedFd), String> {
        let slots = slot_count(chunk_bytes);
        let sb = slot_bytes(chunk_bytes);
        let len = SLOTS_AT + slots * sb;
        let (fd, file) = sealed_memfd(c"chorus-tcp-shm", len)?;
        // Write the layout fields through a temporary mapping-less path:
        // the file is fresh (zero-filled), so every state word is FREE.
        let mut hdr = [0u8; 24];
        hdr[0..8].copy_from_slice(&SEG_MAGIC.to_ne_bytes());
        hdr[8..16].copy_from_slice(&(slots as u64).to_ne_bytes());
        hdr[16..24].copy_from_slice(&(sb as u64).to_ne_bytes());
        std::os::unix::fs::FileExt::write_all_at(&file, &hdr, 0)
            .map_err(|e| format!("cannot write the segment header: {e}"))?;
        let seg = Segment::map_fd(&fd, chunk_bytes)?;
        Ok((seg, fd))
    }
}

/// The sending end of a segment (owned by the worker).
#[derive(Debug)]
pub(super) struct Tx {
    seg: Arc<Segment>,
    /// Bit `i`: slot `i` is FREE but reserved by a [`Reserved`] not yet
    /// published.
    reserved: u64,
}

/// A free slot this sender reserved to fill in place (see
/// [`Tx::reserve`]); publish it with [`Tx::publish`].
#[derive(Debug)]
pub(super) struct Reserved {
    idx: usize,
    len: usize,
}

impl Reserved {
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl Tx {
    fn new(seg: Segment) -> Tx {
        Tx {
            seg: Arc::new(seg),
            reserved: 0,
        }
    }

    /// Reserves a free slot for a payload of `len` bytes, to be written
    /// through [`Tx::slot_mut`] and sent with [`Tx::publish`]; `None` if
    /// `len` exceeds a slot or every slot is in use.
    pub(super) fn reserve(&mut self, len: usize) -> Option<Reserved> {
        if len > self.seg.slot_bytes {
            return None;
        }
        let i = (0..self.seg.slots).find(|&i| {
            self.reserved & (1 << i) == 0 && self.seg.state(i).load(Ordering::Acquire) == FREE
        })?;
        self.reserved |= 1 << i;
        Some(Reserved { idx: i, len })
    }

    /// The bytes of a reserved slot.
    pub(super) fn slot_mut(&mut self, r: &Reserved) -> &mut [u8] {
        // SAFETY: slot `r.idx` is FREE and reserved by this sender (the only
        // writer of this direction; `&mut self` makes this the only
        // reference into it here), so by the slot protocol nobody else
        // touches it until `publish` marks it FULL; the receiver's last read
        // of it happened before its release store of FREE, which the
        // acquire load in `reserve` observed. `r.len <= slot_bytes` keeps
        // the slice inside the mapping, which `self.seg` keeps alive.
        unsafe { std::slice::from_raw_parts_mut(self.seg.slot_ptr(r.idx), r.len) }
    }

    /// Marks a reserved slot FULL for one reader (its payload written);
    /// returns its number, to send in the frame header.
    pub(super) fn publish(&mut self, r: Reserved) -> u16 {
        self.publish_for(r, 1)
    }

    /// Marks a reserved slot FULL for `readers` readers (a broadcast
    /// segment's slot is read by several peers; each frees its share).
    pub(super) fn publish_for(&mut self, r: Reserved, readers: u32) -> u16 {
        self.reserved &= !(1 << r.idx);
        self.seg.state(r.idx).store(readers, Ordering::Release);
        r.idx as u16
    }

    /// The writing end of this segment's pipe; take it once (the pipe has
    /// one writer).
    pub(super) fn pipe(&self) -> PipeTx {
        PipeTx {
            seg: self.seg.clone(),
            tx: pipe::Tx::new(PIPE_BYTES),
        }
    }

    /// Copies `payload` (at most a slot) into a free slot and marks it
    /// `FULL`; returns the slot, or `None` if every slot is in use (send the
    /// payload through the socket then).
    pub(super) fn try_put(&mut self, payload: &[u8]) -> Option<u16> {
        let r = self.reserve(payload.len())?;
        self.slot_mut(&r).copy_from_slice(payload);
        Some(self.publish(r))
    }
}

/// The receiving end of a segment (shared by a reader task and the frames
/// it produced).
#[derive(Debug, Clone)]
pub(super) struct Rx {
    seg: Arc<Segment>,
}

impl Rx {
    /// The reading end of this segment's pipe; take it once (the pipe has
    /// one reader).
    pub(super) fn pipe(&self) -> PipeRx {
        PipeRx {
            seg: self.seg.clone(),
            rx: pipe::Rx::new(PIPE_BYTES),
        }
    }

    /// The payload of a frame the peer put in `slot`, `len` bytes long.
    ///
    /// # Errors
    ///
    /// A description if the slot or length is out of range or the slot is
    /// not `FULL` (a corrupt stream or a peer that broke the protocol).
    pub(super) fn take(&self, slot: u16, len: u64) -> Result<Slot, String> {
        let i = slot as usize;
        if i >= self.seg.slots || len > self.seg.slot_bytes as u64 {
            return Err(format!(
                "shared-memory frame names slot {i} with {len} bytes, but the segment has {} slots of {} bytes",
                self.seg.slots, self.seg.slot_bytes
            ));
        }
        if self.seg.state(i).load(Ordering::Acquire) == FREE {
            return Err(format!(
                "shared-memory frame names slot {i}, which the peer did not fill"
            ));
        }
        Ok(Slot {
            seg: self.seg.clone(),
            idx: i,
            len: len as usize,
        })
    }
}

/// A `FULL` slot owned by this (receiving) rank: a frame's payload. Freed
/// when dropped.
pub(super) struct Slot {
    seg: Arc<Segment>,
    idx: usize,
    len: usize,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slot({}, {} bytes)", self.idx, self.len)
    }
}

impl Slot {
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: the slot is FULL (checked with an acquire load in
        // `Rx::take`, which synchronizes with the sender's release store
        // after its copy), so the sender does not touch it until this
        // `Slot` is dropped and marks it FREE; `len <= slot_bytes` keeps the
        // slice inside the mapping, which `seg` keeps alive.
        unsafe { std::slice::from_raw_parts(self.seg.slot_ptr(self.idx), self.len) }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only reference
        // into the slot in this process, and the peer does not touch a FULL
        // slot.
        unsafe { std::slice::from_raw_parts_mut(self.seg.slot_ptr(self.idx), self.len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // One reader fewer. Every read of the slot happens before this
        // release decrement; the sender's acquire load of FREE (0) then sees
        // every reader's reads done (the decrements form a release
        // sequence).
        self.seg.state(self.idx).fetch_sub(1, Ordering::Release);
    }
}

/// The writing end of the pipe in this rank's segment to a peer (owned by
/// the worker, through the connection's write side).
#[derive(Debug)]
pub(super) struct PipeTx {
    seg: Arc<Segment>,
    tx: pipe::Tx,
}

impl PipeTx {
    /// Copies as much of `src` as fits into the pipe and publishes it:
    /// the bytes taken, and whether the reader sleeps and must be woken.
    pub(super) fn write(&mut self, src: &[u8]) -> (usize, Wake) {
        let w = self.seg.pipe_words();
        let mut done = 0;
        let mut wake = Wake::None;
        // At most two pieces: up to the ring's end, then from its start.
        while done < src.len() {
            let r = self.tx.space(&w);
            if r.is_empty() {
                break;
            }
            let n = r.len().min(src.len() - done);
            // SAFETY: `r` is free space of the ring (`r.end <= PIPE_BYTES`):
            // by the pipe protocol the reader does not touch it until the
            // commit below publishes it, and this side is its only writer
            // (`&mut self`); the mapping lives as long as `self.seg`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src[done..].as_ptr(),
                    self.seg.pipe_ptr().add(r.start),
                    n,
                );
            }
            done += n;
            if self.tx.commit(&w, n) == Wake::Peer {
                wake = Wake::Peer;
            }
        }
        (done, wake)
    }
}

/// The reading end of the pipe in a peer's segment (owned by the reader
/// task, through the connection's read side).
#[derive(Debug)]
pub(super) struct PipeRx {
    seg: Arc<Segment>,
    rx: pipe::Rx,
}

impl PipeRx {
    /// Copies published bytes into `dst` and gives their room back: the
    /// bytes read (0: none published).
    pub(super) fn read(&mut self, dst: &mut [u8]) -> usize {
        let w = self.seg.pipe_words();
        let mut done = 0;
        while done < dst.len() {
            let r = self.rx.data(&w);
            if r.is_empty() {
                break;
            }
            let n = r.len().min(dst.len() - done);
            // SAFETY: `r` holds bytes the writer published (acquire load of
            // `head` in `data`), which it does not touch again until this
            // side gives them back below; `r.end <= PIPE_BYTES` keeps it in
            // the mapping, which `self.seg` keeps alive.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.seg.pipe_ptr().add(r.start),
                    dst[done..].as_mut_ptr(),
                    n,
                );
            }
            done += n;
            // The writer never sleeps for space (it backs off), so what
            // this frees wakes nobody.
            let _ = self.rx.consume(&w, n);
        }
        done
    }

    /// Before the reader sleeps for data: whether it may (no data came
    /// meanwhile; the writer then rings the doorbell after its next
    /// commit).
    pub(super) fn sleep(&self) -> bool {
        self.rx.sleep(&self.seg.pipe_words())
    }

    /// The reader spins on the pipe: the writer need not ring.
    pub(super) fn watch(&self) {
        self.rx.watch(&self.seg.pipe_words());
    }
}

/// Payloads from this size on are copied with streaming stores
/// ([`copy_out`]).
const STREAM_MIN: usize = 64 << 10;

/// The smallest op buffer whose final bytes are written with streaming
/// stores ([`copy_out`]) where `host_ranks` ranks share this host: one
/// above the last-level cache's share of each rank (the largest cache
/// `cpu0` lists in sysfs), so that the buffers of this host's ranks
/// together overflow that cache and a line written through it would be
/// evicted unread anyway. `usize::MAX` (never) where the cache size is
/// unknown.
pub(super) fn stream_from(host_ranks: usize) -> usize {
    last_level_cache().map_or(usize::MAX, |c| c / host_ranks.max(1) + 1)
}

/// Bytes of the largest cache of `cpu0`, from sysfs.
fn last_level_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let size = std::fs::read_to_string(e.ok()?.path().join("size")).ok()?;
        let size = size.trim();
        let (num, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
        let scale = match unit {
            "K" => 1 << 10,
            "M" => 1 << 20,
            _ => return None,
        };
        num.parse::<usize>().ok().map(|n| n * scale)
    })
    .max()
}

/// Copies a received payload `src` into the op's buffer `dst` (equal
/// lengths): the op's final bytes, which it does not read again. From
/// [`STREAM_MIN`] bytes on x86-64, with non-temporal stores: the caller
/// uses it where the buffers of this host's ranks together overflow the
/// last-level cache ([`stream_from`]), so writing around the caches skips
/// reading every destination line first and leaves the caches to the
/// slots still in flight (4 ranks on 2 cores, 16 MiB all_reduce: about
/// 12 % faster). A fence ends the copy, so it is ordered before whatever
/// this thread stores next (a slot's release, the op's completion).
pub(super) fn copy_out(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= STREAM_MIN && dst.len() == src.len() {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) / 16 * 16;
        let (d, s) = (&mut dst[head..head + body], &src[head..head + body]);
        for (d, s) in d.chunks_exact_mut(16).zip(s.chunks_exact(16)) {
            // SAFETY: SSE2 is part of x86-64. `s` is 16 readable bytes
            // (an unaligned load); `d` is 16 writable bytes at a 16-byte
            // aligned address (`head` aligned the body, whose chunks are
            // 16 bytes), as the streaming store requires.
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
            }
        }
        // SAFETY: SSE (part of x86-64); orders the streaming stores above
        // before every later store of this thread.
        unsafe { _mm_sfence() };
        let tail = head + body;
        dst[tail..].copy_from_slice(&src[tail..]);
        return;
    }
    dst.copy_from_slice(src);
}

/// This rank's ends of the segments with one peer.
#[derive(Debug, Default)]
pub(super) struct Pair {
    /// To the peer (`None`: frames go through the socket).
    pub(super) tx: Option<Tx>,
    /// From the peer.
    pub(super) rx: Option<Rx>,
    /// The peer's broadcast segment.
    pub(super) brx: Option<Rx>,
    /// Whether the peer mapped this rank's broadcast segment.
    pub(super) bcast_ok: bool,
}

/// A rank's broadcast segment: written once, read by every local peer
/// (the all-gather phase of the all-local all_reduce). Created before the
/// mesh; its descriptor goes to every local peer with the pair's.
#[derive(Debug)]
pub(super) struct Bcast {
    seg: Arc<Segment>,
    fd: std::os::fd::OwnedFd,
}

impl Bcast {
    /// Creates the broadcast segment for `chunk_bytes`.
    ///
    /// # Errors
    ///
    /// A description if it cannot be created.
    #[cfg(target_os = "linux")]
    pub(super) fn create(chunk_bytes: usize) -> Result<Bcast, String> {
        let (seg, fd) = Segment::create(chunk_bytes)?;
        Ok(Bcast {
            seg: Arc::new(seg),
            fd,
        })
    }

    /// Without Linux, never shared memory.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn create(_: usize) -> Result<Bcast, String> {
        Err("shared memory is only used on Linux".into())
    }

    /// The sending end (used once the mesh is built).
    pub(super) fn tx(&self) -> Tx {
        Tx {
            seg: self.seg.clone(),
            reserved: 0,
        }
    }
}

/// Length of the two setup messages.
const MSG_LEN: usize = 16;
/// First bytes of the setup messages ("CSHM").
const MSG_MAGIC: u32 = 0x4d48_5343;

fn msg(status: u32) -> [u8; MSG_LEN] {
    let mut m = [0u8; MSG_LEN];
    m[0..4].copy_from_slice(&MSG_MAGIC.to_le_bytes());
    m[4..8].copy_from_slice(&status.to_le_bytes());
    m
}

fn parse(m: &[u8; MSG_LEN], what: &str) -> Result<u32, String> {
    if m[0..4] != MSG_MAGIC.to_le_bytes() {
        return Err(format!("bad shared-memory {what} message"));
    }
    Ok(u32::from_le_bytes([m[4], m[5], m[6], m[7]]))
}

/// Sets up the segments with a peer over a fresh (handshaken) Unix socket,
/// Both ends at once: each creates its outgoing segment and sends its
/// descriptor and that of `bcast`, this rank's broadcast segment (or that
/// it has none), maps the peer's and acknowledges them.
/// Failures to create or map are not errors: that direction uses the
/// socket (logged). Errors are socket failures, which end setup.
///
/// # Errors
///
/// A description if the socket fails or the peer's messages are corrupt.
#[cfg(target_os = "linux")]
pub(super) async fn exchange(
    s: &mut tokio::net::UnixStream,
    peer: usize,
    chunk_bytes: usize,
    bcast: Option<&Bcast>,
) -> Result<Pair, String> {
    use std::os::fd::AsRawFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};

    let mine = match Segment::create(chunk_bytes) {
        Ok(x) => Some(x),
        Err(e) => {
            tracing::info!(peer, error = %e, "no shared-memory segment to this peer; using the socket");
            None
        }
    };
    // Status bits: 1 = the pair segment's descriptor, 2 = the broadcast
    // segment's (attached in that order).
    let offer = msg(u32::from(mine.is_some()) | (u32::from(bcast.is_some()) << 1));
    let fds: Vec<i32> = mine
        .as_ref()
        .map(|(_, fd)| fd.as_raw_fd())
        .into_iter()
        .chain(bcast.map(|b| b.fd.as_raw_fd()))
        .collect();
    let raw = s.as_raw_fd();
    let sent = s
        .async_io(Interest::WRITABLE, || send_with_fds(raw, &offer, &fds))
        .await
        .map_err(|e| format!("sending the shared-memory offer to rank {peer}: {e}"))?;
    if sent < MSG_LEN {
        s.write_all(&offer[sent..])
            .await
            .map_err(|e| format!("sending the shared-memory offer to rank {peer}: {e}"))?;
    }
    let mut got = [0u8; MSG_LEN];
    let (n, their_fds) = s
        .async_io(Interest::READABLE, || recv_with_fds(raw, &mut got))
        .await
        .map_err(|e| format!("reading the shared-memory offer of rank {peer}: {e}"))?;
    if n == 0 {
        return Err(format!(
            "rank {peer} closed the connection during the shared-memory setup"
        ));
    }
    if n < MSG_LEN {
        s.read_exact(&mut got[n..])
            .await
            .map_err(|e| format!("reading the shared-memory offer of rank {peer}: {e}"))?;
    }
    let status = parse(&got, "offer")?;
    let mut their_fds = their_fds.into_iter();
    let mut map = |bit: u32, what: &str| {
        if status & bit == 0 {
            return None;
        }
        let Some(fd) = their_fds.next() else {
            tracing::info!(
                peer,
                "the peer's {what} descriptor did not arrive; not used"
            );
            return None;
        };
        match Segment::map_fd(&fd, chunk_bytes) {
            Ok(seg) => Some(Rx { seg: Arc::new(seg) }),
            Err(e) => {
                tracing::info!(peer, error = %e, "cannot map the peer's {what}; not used");
                None
            }
        }
    };
    let rx = map(1, "shared-memory segment");
    let brx = map(2, "broadcast segment");
    s.write_all(&msg(
        u32::from(rx.is_some()) | (u32::from(brx.is_some()) << 1)
    ))
    .await
    .map_err(|e| format!("acknowledging rank {peer}'s shared memory: {e}"))?;
    let mut ack = [0u8; MSG_LEN];
    s.read_exact(&mut ack)
        .await
        .map_err(|e| format!("reading rank {peer}'s shared-memory acknowledgement: {e}"))?;
    let acked = parse(&ack, "acknowledgement")?;
    // Our descriptor is closed here; the mappings keep the memory.
    let tx = match mine {
        Some((seg, _fd)) if acked & 1 != 0 => Some(Tx::new(seg)),
        _ => None,
    };
    Ok(Pair {
        tx,
        rx,
        brx,
        bcast_ok: bcast.is_some() && acked & 2 != 0,
    })
}

/// Without Linux, never shared memory.
#[cfg(not(target_os = "linux"))]
pub(super) async fn exchange(
    _: &mut tokio::net::UnixStream,
    _: usize,
    _: usize,
    _: Option<&Bcast>,
) -> Result<Pair, String> {
    Ok(Pair::default())
}

/// One `sendmsg` of `data` with `fds` (at most 2) attached (`SCM_RIGHTS`);
/// returns the bytes sent.
#[cfg(target_os = "linux")]
fn send_with_fds(sock: i32, data: &[u8], fds: &[i32]) -> io::Result<usize> {
    // Room for a control message of two descriptors, u64-aligned.
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    let fds = &fds[..fds.len().min(2)];
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure size computations;
        // CMSG_FIRSTHDR points into `cbuf`, which is large enough for two
        // `c_int`s (CMSG_SPACE(8) = 24 <= 32 bytes, checked) and outlives
        // the call; CMSG_DATA points inside that header's data area, which
        // holds `fds.len() <= 2` descriptors.
        unsafe {
            let space = libc::CMSG_SPACE(bytes) as usize;
            if space > std::mem::size_of_val(&cbuf) {
                return Err(io::Error::other("control buffer too small"));
            }
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            let data = libc::CMSG_DATA(c).cast::<i32>();
            for (k, fd) in fds.iter().enumerate() {
                data.add(k).write_unaligned(*fd);
            }
        }
    }
    // SAFETY: `mh` points at `iov` (valid for `data.len()` bytes) and, if
    // set, at `cbuf`; all live across the call.
    let n = unsafe { libc::sendmsg(sock, &mh, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// One `recvmsg` into `buf`; returns the bytes read and the descriptors
/// attached, in order.
#[cfg(target_os = "linux")]
fn recv_with_fds(sock: i32, buf: &mut [u8]) -> io::Result<(usize, Vec<std::os::fd::OwnedFd>)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: `mh` points at `iov` (valid, writable, `buf.len()` bytes) and
    // `cbuf`, both live across the call.
    let n = unsafe { libc::recvmsg(sock, &mut mh, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `mh.msg_control`/`msg_controllen`; the
    // CMSG_* helpers walk only within that buffer. A SCM_RIGHTS message
    // carries `c_int` descriptors that now belong to this process: each is
    // wrapped in an `OwnedFd` (closed if unused).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for k in 0..bytes / std::mem::size_of::<i32>() {
                    let raw = data.cast::<i32>().add(k).read_unaligned();
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("control message truncated"));
    }
    Ok((n as usize, fds))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Streaming copies give the bytes a plain copy gives, at every
    /// alignment of either side and for lengths around the threshold and
    /// off whole 16-byte stores; the bytes around the destination stay.
    #[test]
    fn copy_out_copies_exactly_at_every_alignment() {
        let src: Vec<u8> = (0..STREAM_MIN * 2 + 64)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 17,
            STREAM_MIN * 2 - 3,
        ] {
            for (so, d_off) in [(0, 0), (1, 0), (0, 5), (7, 13), (16, 15)] {
                let mut dst = vec![0xAAu8; len + 64];
                copy_out(&mut dst[d_off..d_off + len], &src[so..so + len]);
                assert_eq!(
                    &dst[d_off..d_off + len],
                    &src[so..so + len],
                    "len {len}, offsets {so}/{d_off}"
                );
                assert!(dst[..d_off].iter().all(|&b| b == 0xAA), "before the copy");
                assert!(
                    dst[d_off + len..].iter().all(|&b| b == 0xAA),
                    "after the copy"
                );
            }
        }
    }

    #[test]
    fn streaming_starts_above_each_ranks_share_of_the_cache() {
        if let Some(c) = last_level_cache() {
            assert!(c >= 64 << 10, "a last-level cache of {c} bytes");
            assert_eq!(stream_from(1), c + 1);
            assert_eq!(stream_from(4), c / 4 + 1);
        } else {
            assert_eq!(stream_from(4), usize::MAX);
        }
    }

    /// Both ends of one segment's pipe, as two processes would map it: the
    /// creator's mapping writes, a second mapping of the same memory reads.
    fn pipe_pair() -> (PipeTx, PipeRx) {
        let (seg, fd) = Segment::create(64 << 10).expect("a segment");
        let peer = Segment::map_fd(&fd, 64 << 10).expect("a second mapping");
        let tx = Tx::new(seg).pipe();
        let rx = Rx {
            seg: Arc::new(peer),
        }
        .pipe();
        (tx, rx)
    }

    /// Many writes of odd sizes, read back in pieces of other sizes, wrap
    /// around the ring many times with the reader lagging: every byte
    /// comes out once, in order; a full ring takes nothing more until the
    /// reader frees room.
    #[test]
    fn pipe_bytes_come_out_in_order_across_wraps_with_a_lagging_reader() {
        let (mut tx, mut rx) = pipe_pair();
        let total = 5 * PIPE_BYTES + 12_345;
        let src: Vec<u8> = (0..total).map(|i| (i * 31 + i / 7) as u8).collect();
        let mut out = Vec::with_capacity(total);
        let mut at = 0;
        let mut buf = vec![0u8; 70_001];
        let mut k = 0usize;
        while out.len() < total {
            // Write until the ring is full (the reader lags), in odd sizes.
            loop {
                let end = (at + 4099 + (k % 5) * 1000).min(total);
                let (n, _) = tx.write(&src[at..end]);
                at += n;
                k += 1;
                if n == 0 || at == total {
                    break;
                }
            }
            let want = 1 + (k * 7919) % buf.len();
            let n = rx.read(&mut buf[..want]);
            out.extend_from_slice(&buf[..n]);
            assert!(n > 0 || at == out.len(), "nothing to read while bytes wait");
        }
        assert_eq!(out.len(), total);
        assert!(out == src, "the bytes differ");
    }

    /// A reader that says it sleeps is woken by the next write, once.
    #[test]
    fn a_sleeping_reader_is_woken_by_the_next_write() {
        let (mut tx, mut rx) = pipe_pair();
        assert!(rx.sleep(), "nothing to read: it may sleep");
        assert_eq!(tx.write(b"abc"), (3, Wake::Peer));
        assert_eq!(tx.write(b"d"), (1, Wake::None));
        let mut b = [0u8; 8];
        assert_eq!(rx.read(&mut b), 4);
        assert_eq!(&b[..4], b"abcd");
        // A reader that watches (a spinning caller) costs the writer no
        // doorbell.
        assert!(rx.sleep());
        rx.watch();
        assert_eq!(tx.write(b"e"), (1, Wake::None));
    }
}
