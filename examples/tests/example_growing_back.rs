//! `examples/growing_back.rs` — the growing-back loop of docs/FAULTS.md as
//! it stands there — under its own `chorus-run --keep-going --max-restarts`:
//! a rank killed mid-run (rank 0 included) comes back, and every rank of
//! the final, whole group holds the serial result bit for bit. Taking the
//! state before the first `admit`, as the docs warn against, fails at once
//! with `NotAdmitted` and leaves the others going, without a storm of
//! re-forms.
#![forbid(unsafe_code)]

use tests_integration::testkit::run_self_launching;

fn run(args: &[&str]) -> (bool, String) {
    let (out, text) = run_self_launching("growing_back", args);
    (out.status.success(), text)
}

fn final_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.contains("growing back:"))
        .unwrap_or_else(|| panic!("no summary line:\n{text}"))
}

#[test]
fn a_killed_rank_rejoins_through_the_same_loop() {
    for kill in ["1@40", "0@25", "2@60"] {
        let (ok, text) = run(&["--nproc", "3", "--max-restarts", "1", "--kill", kill]);
        assert!(ok, "kill {kill}:\n{text}");
        let line = final_line(&text);
        assert!(
            line.contains("final group of 3 ranks"),
            "kill {kill}: {line}\n{text}"
        );
        assert!(line.ends_with("OK"), "kill {kill}: {line}");
        assert!(text.contains("VICTIM"), "kill {kill}: nobody died:\n{text}");
    }
}

#[test]
fn taking_the_state_before_admit_is_refused_at_once() {
    let t0 = std::time::Instant::now();
    let (ok, text) = run(&[
        "--nproc",
        "3",
        "--max-restarts",
        "1",
        "--kill",
        "1@30",
        "--misplace",
    ]);
    assert!(!ok, "the misplaced replacement must fail:\n{text}");
    assert!(
        text.contains("NotAdmitted") || text.contains("call admit"),
        "{text}"
    );
    // The survivors re-form without it and finish; no storm of epochs.
    let line = final_line(&text);
    assert!(line.ends_with("OK"), "{line}\n{text}");
    let epochs: Vec<&str> = text.matches("world@").collect();
    assert!(
        epochs.len() < 20,
        "re-formed {} times:\n{text}",
        epochs.len()
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(60), "{text}");
}
