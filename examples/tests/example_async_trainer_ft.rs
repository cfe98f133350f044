//! The `async_trainer` example (`examples/async_trainer/`) with
//! `--fault-tolerant`, under its own `chorus-run
//! --keep-going --max-restarts N`: ranks SIGKILLed at random steps (rank 0
//! included, two at once) are restarted and rejoin; the run still halves
//! its loss and ends with bit-identical parameters on the whole world.
//! Without restarts, the survivors finish on a smaller group.
#![forbid(unsafe_code)]

use rand::{Rng, SeedableRng};
use tests_integration::testkit::run_self_launching;

/// Steps of a `--quick` run on `world` ranks (2048 samples, batch 32, 4
/// epochs).
fn steps(world: usize) -> usize {
    4 * (2048 / (world * 32))
}

fn run(nproc: usize, restarts: u32, kill: &str) -> (bool, String) {
    let (out, text) = run_self_launching(
        "async_trainer",
        &[
            "--fault-tolerant",
            "--quick",
            "--device",
            "cpu",
            "--reform-window-ms",
            "800",
            "--nproc",
            &nproc.to_string(),
            "--max-restarts",
            &restarts.to_string(),
            "--kill",
            kill,
        ],
    );
    (out.status.success(), text)
}

/// The run's summary: failures seen, the last epoch's world size; checks
/// the loss and identity lines, and (`stepped_after`) that a step followed
/// every failure (not so for a kill in the last step: the run re-forms to
/// check its parameters, and no step is left).
fn summary(text: &str, world: usize, stepped_after: bool) -> (usize, usize) {
    let line = |key: &str| {
        text.lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("no '{key}' line:\n{text}"))
            .to_string()
    };
    let failures: usize = line("failures seen: ")
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("failures");
    let last: usize = line("world size per epoch: ")
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("size");
    assert!(line("loss fell from").ends_with("OK"), "{text}");
    let same = line("parameters bit-identical on all");
    assert!(
        same.contains(&format!("on all {last} ranks")) && same.ends_with("OK"),
        "{text}"
    );
    if stepped_after {
        assert!(!line("time from each failure").contains("never"), "{text}");
    }
    assert!(last <= world);
    (failures, last)
}

#[test]
fn a_rank_killed_at_a_random_step_rejoins_and_the_run_converges() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..10 {
        let (r, s) = (rng.gen_range(0..3), rng.gen_range(0..steps(3)));
        let (ok, text) = run(3, 1, &format!("{r}@{s}"));
        assert!(ok, "kill {r}@{s}:\n{text}");
        let last = s + 1 == steps(3);
        assert_eq!(summary(&text, 3, !last), (1, 3), "kill {r}@{s}:\n{text}");
    }
}

#[test]
fn rank_0_and_another_killed_at_once_both_rejoin() {
    let (ok, text) = run(4, 2, "0@9,2@9");
    assert!(ok, "{text}");
    assert_eq!(summary(&text, 4, true).1, 4, "{text}");
}

#[test]
fn without_restarts_the_survivors_finish_on_a_smaller_group() {
    let (_, text) = run(4, 0, "1@5,2@5");
    assert_eq!(summary(&text, 4, true), (1, 2), "{text}");
}
