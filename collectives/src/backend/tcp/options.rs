//! [`TcpOptions`]: the settings of the TCP backend.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Settings of the TCP backend. Every rank of a group must use the same
/// `crossover_bytes` and `chunk_bytes` (checked when the group connects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpOptions {
    /// The address other ranks use to reach this rank; the listener binds to
    /// it (port chosen by the OS). Default `127.0.0.1`, which only works when
    /// every rank runs on this host.
    pub advertise_ip: IpAddr,
    /// Messages of at least this many bytes use the bandwidth-optimal
    /// algorithms (ring, pipelined chain); smaller ones the low-latency
    /// direct path. Default 64 KiB (measured; see the module docs).
    pub crossover_bytes: usize,
    /// Largest payload of one frame, in bytes: large messages are cut into
    /// chunks of this size and pipelined. At least 8. Default 256 KiB.
    pub chunk_bytes: usize,
    /// How long setup waits for the other ranks' addresses and connections.
    /// Default 60 s.
    pub connect_timeout: Duration,
    /// Reach peers on the same host (and network namespace) through Unix
    /// domain sockets instead of loopback TCP, which is several times faster
    /// (Linux only; elsewhere every peer uses TCP). Peers on other hosts, or
    /// whose Unix socket cannot be reached, use TCP. Default true.
    pub local_unix_sockets: bool,
    /// Move large payloads to peers on the same host through shared memory
    /// (Linux only; needs `local_unix_sockets`, which carries the control
    /// messages): see "Shared memory" in the module docs. Used for a pair
    /// of ranks only when both have it on; otherwise, or if setting it up
    /// fails, payloads go through the socket. In a group of more than 8
    /// ranks that all share this host, the small ops (up to 4 KiB a rank)
    /// also run on one board in shared memory for the whole group, where
    /// every rank writes its part once ("The group's board" in the module
    /// docs); it is used only when every rank has this on. Default true
    /// (`CHORUS_SHM=0` turns it off, see `TcpOptions::from_env`).
    pub shared_memory: bool,
    /// How long a peer on another host may stay silent — no data and no
    /// acknowledgement of the kernel's keepalive probes — before its
    /// connection fails with [`WorkError::PeerSilent`](crate::WorkError::PeerSilent),
    /// however long the op in flight may still run (its own timeout is
    /// separate). A live peer's kernel answers the probes whatever its
    /// process is doing, so only a partition or a stopped host trips it.
    /// Applies to TCP connections (Unix sockets join ranks of one host);
    /// at least 1 s; zero turns it off. Default 10 s
    /// (`CHORUS_LIVENESS_TIMEOUT_S`, see `TcpOptions::from_env`).
    pub liveness_timeout: Duration,
    /// How long the caller that awaits a small op (at most
    /// `crossover_bytes`) runs it on its own thread — reading the peers'
    /// frames from the sockets and shared-memory pipes, reducing,
    /// completing — with no frame sent or received, before it parks and
    /// leaves the rest to chorus's I/O threads (see "Ops on the caller's
    /// thread" in the module docs): an op that keeps moving is driven to
    /// its end. Where this host's ranks outnumber its cores, the caller
    /// drives large ops too, and waits at least 2 ms for them to move.
    /// The caller yields its core between looks (`sched_yield`) where this
    /// host's ranks outnumber its cores, so a peer that shares the core
    /// runs, and every few looks elsewhere.
    /// `None` (the default) picks 100 µs, or zero where this host's ranks
    /// outnumber its cores more than 16 times (their spinning would take
    /// the cores their peers need); zero turns it off (the
    /// op's first frames still leave from the submitting thread).
    /// `CHORUS_TCP_SPIN_US` sets it, see `TcpOptions::from_env`.
    pub caller_spin: Option<Duration>,
}

/// The default [`TcpOptions::caller_spin`] where this host's ranks have a
/// core each: a little more than a round trip through a peer whose thread
/// has to wake up on a small VM, so that a peer that is a moment late is
/// still met without a wake-up, and a peer much later costs at most this
/// much of the caller's core.
pub(crate) const CALLER_SPIN: Duration = Duration::from_micros(100);

impl TcpOptions {
    /// The caller spin: [`caller_spin`](Self::caller_spin) if set, else
    /// [`CALLER_SPIN`], wherever this host's ranks outnumber its cores or
    /// not (the spinning caller yields its core there, see `drive`).
    pub(super) fn spin(&self) -> Duration {
        self.caller_spin.unwrap_or(CALLER_SPIN)
    }
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            advertise_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            crossover_bytes: 64 << 10,
            chunk_bytes: 256 << 10,
            connect_timeout: Duration::from_secs(60),
            local_unix_sockets: true,
            shared_memory: true,
            liveness_timeout: Duration::from_secs(10),
            caller_spin: None,
        }
    }
}

/// Largest accepted `chunk_bytes`.
pub(super) const MAX_CHUNK: usize = 1 << 30;
