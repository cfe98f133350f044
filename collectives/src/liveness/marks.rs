//! The marks a beat counter can carry besides its beats.

/// Added to a rank's counter when it leaves the group cleanly (shutdown,
/// or its last handle dropped): a counter at or above it is a peer that
/// left, never a silent one (a rank that finished early while others go
/// on with ops that do not need it).
pub(crate) const LEFT: i64 = 1 << 48;

/// Added to a peer's counter by the rank that found it lost (its beat
/// stopped after the backend reported a failed peer): the group's other
/// ranks, whose backends may not have noticed yet, name it at their next
/// reading.
pub(crate) const LOST: i64 = 1 << 52;
