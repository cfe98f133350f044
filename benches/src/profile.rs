//! Printing the enqueue phases profiled so far (feature `profile`).

/// Prints the enqueue phases' medians of the ops profiled so far, when
/// `CHORUS_NCCL_PROFILE=1` (see `chorus_core::profile`).
pub fn print_profile() {
    let (phases, n) = chorus_core::profile::medians();
    if n > 0 {
        println!(
            "profile (CHORUS_NCCL_PROFILE=1), median over {n} ops (each stamp adds ~0.03 us):"
        );
        for (phase, us) in chorus_core::profile::Phase::ALL.iter().zip(phases) {
            println!("  {:<58} {us:6.3} us", phase.name());
        }
    }
}
