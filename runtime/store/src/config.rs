//! The store layer's settings from the environment: the one place where it
//! reads `CHORUS_*` variables. Each has a builder equivalent.
//!
//! | variable | default | fills |
//! |---|---|---|
//! | `CHORUS_STORE_TOKEN` | none | [`ServerOptions::token`](crate::ServerOptions::token), [`ClientOptions::token`](crate::ClientOptions::token), `RendezvousConfigBuilder::token` |
//! | `CHORUS_RENDEZVOUS_TIMEOUT` | 300 s | `RendezvousConfigBuilder::timeout` |
//! | `CHORUS_IO_THREADS` | cores ÷ local ranks, 1–2 | [`rt::configure`](crate::rt::configure) |
//! | `CHORUS_WAIT_REPORT_S` | 5 | [`wait_report::set_every`](crate::wait_report::set_every) (`0`: off) |
//!
//! The rendezvous reads its two (with torchrun's, SLURM's and Open MPI's
//! variables) through `RendezvousConfig::from_env`, which takes their names
//! from here.

use std::time::Duration;

/// Environment variable holding the shared store token.
pub const TOKEN_ENV: &str = "CHORUS_STORE_TOKEN";

/// Environment variable holding the rendezvous timeout, in seconds.
pub(crate) const RENDEZVOUS_TIMEOUT_ENV: &str = "CHORUS_RENDEZVOUS_TIMEOUT";

/// torchrun's word that its agent serves the workers' store
/// (`TORCHELASTIC_USE_AGENT_STORE=True`; read with the rendezvous's other
/// launcher variables).
pub(crate) const AGENT_STORE_ENV: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// The shared token from `CHORUS_STORE_TOKEN`, if set and not empty.
pub(crate) fn token() -> Option<String> {
    std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty())
}

/// The I/O thread count from `CHORUS_IO_THREADS`, if set to a positive
/// number.
pub(crate) fn io_threads() -> Option<usize> {
    std::env::var("CHORUS_IO_THREADS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
}

/// How often long waits report, from `CHORUS_WAIT_REPORT_S` (seconds,
/// decimals allowed; `0`: never), if set to such a number.
pub(crate) fn wait_report_every() -> Option<Duration> {
    std::env::var("CHORUS_WAIT_REPORT_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
}
