//! Locking the store's tables.

/// Locks `m`, taking the data back from a thread that panicked holding it:
/// the store's tables stay consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
