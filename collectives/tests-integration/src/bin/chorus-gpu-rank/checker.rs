//! [`Checker`], the checks a scenario counts and the mismatches it
//! records, and [`report`], which prints its outcome.

use chorus::ReduceOp;
use tests_integration::testkit::{reduce_tolerance, TestElem};

use super::support::Res;

/// Counts checks and records mismatches (all of them, not only the first).
#[derive(Default)]
pub(super) struct Checker {
    pub(super) checks: usize,
    pub(super) fails: Vec<String>,
}

impl Checker {
    /// A check that is a condition: `what` held, or failed as `detail`.
    pub(super) fn count(&mut self, what: String, ok: bool, detail: String) {
        self.checks += 1;
        if !ok {
            self.fails.push(format!("{what}: {detail}"));
        }
    }

    /// `got` against `want`, element for element, bit for bit.
    pub(super) fn check<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: String,
        got: &[T],
        want: &[T],
    ) {
        self.compare(what, got, want, |a, b| a != b, "");
    }

    /// A reduction's result against the serial reference, bit for bit but
    /// where [`reduce_tolerance`] allows a few roundings (a floating-point
    /// mean over a group whose size is not a power of two).
    pub(super) fn check_reduced<T: TestElem>(
        &mut self,
        what: String,
        got: &[T],
        want: &[T],
        op: ReduceOp,
        size: usize,
    ) {
        self.check_within(what, got, want, reduce_tolerance::<T>(op, size));
    }

    /// `got` against `want`, each element within `tol` (bit for bit where
    /// `tol` is 0).
    pub(super) fn check_within<T: TestElem>(
        &mut self,
        what: String,
        got: &[T],
        want: &[T],
        tol: f64,
    ) {
        if tol == 0.0 {
            return self.check(what, got, want);
        }
        let far = |a: &T, b: &T| (a.to_f64() - b.to_f64()).abs() > tol;
        self.compare(what, got, want, far, &format!(" by more than {tol:e}"));
    }

    /// Counts one check of `got` against `want`, failed where lengths
    /// differ or `differ` holds for any element.
    fn compare<T: std::fmt::Debug>(
        &mut self,
        what: String,
        got: &[T],
        want: &[T],
        differ: impl Fn(&T, &T) -> bool,
        by: &str,
    ) {
        self.checks += 1;
        if got.len() != want.len() {
            self.fails.push(format!(
                "{what}: {} elements, expected {}",
                got.len(),
                want.len()
            ));
            return;
        }
        let bad: Vec<usize> = (0..got.len())
            .filter(|&i| differ(&got[i], &want[i]))
            .collect();
        if let Some(&i) = bad.first() {
            self.fails.push(format!(
                "{what}: {} of {} elements differ{by}; first at {i}: got {:?}, expected {:?}",
                bad.len(),
                got.len(),
                got[i],
                want[i]
            ));
        }
    }
}

/// Prints a scenario's outcome (`OK`, or each `MISMATCH` and `FAIL`) and
/// returns the exit code.
pub(super) fn report(rank: usize, outcome: Res<Checker>, extra: &str) -> i32 {
    match outcome {
        Ok(ck) if ck.fails.is_empty() => {
            println!("OK rank={rank} checks={}{extra}", ck.checks);
            0
        }
        Ok(ck) => {
            for f in &ck.fails {
                println!("MISMATCH rank={rank} {f}");
            }
            println!(
                "FAIL rank={rank} {} of {} checks failed",
                ck.fails.len(),
                ck.checks
            );
            1
        }
        Err(e) => {
            println!("FAIL rank={rank} {e}");
            1
        }
    }
}
