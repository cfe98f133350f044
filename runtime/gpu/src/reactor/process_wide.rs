//! The process-wide reactor: [`global`]; [`configure`], which sets its
//! settings before its first use; [`stats`], its counters.

use std::sync::{Mutex, OnceLock};

use super::handle::{Reactor, ReactorStats};
use crate::config::ReactorConfig;
use chorus_core::sync::lock;

/// The process-wide reactor. Its settings are those given to
/// [`configure`] before its first use, else the defaults overridden by the
/// environment ([`ReactorConfig::from_env`]). Its thread starts on the
/// first registration.
pub fn global() -> &'static Reactor {
    GLOBAL.get_or_init(|| {
        let pending = lock(&PENDING).take();
        Reactor::new(pending.unwrap_or_else(ReactorConfig::from_env))
    })
}

static GLOBAL: OnceLock<Reactor> = OnceLock::new();
static PENDING: Mutex<Option<ReactorConfig>> = Mutex::new(None);

/// Sets the process-wide reactor's settings (the builder equivalent of the
/// `CHORUS_REACTOR_*` variables). Takes effect only before the reactor's
/// first use; returns false if it is already running with other settings.
pub fn configure(config: ReactorConfig) -> bool {
    if let Some(r) = GLOBAL.get() {
        return r.config() == config;
    }
    *lock(&PENDING) = Some(config);
    true
}

/// The process-wide reactor's counters (all zero before its first use).
pub fn stats() -> ReactorStats {
    GLOBAL.get().map(Reactor::stats).unwrap_or_default()
}
