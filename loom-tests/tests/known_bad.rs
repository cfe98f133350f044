//! The suite can fail: a deliberately broken cache (check, unlock, then
//! insert without checking again; `CheckThenInsert`, outside the production
//! cache) must be caught by the same single-flight model that the
//! production cache passes.
#![forbid(unsafe_code)]
#![cfg(loom)]

use chorus_loom_tests::{model, single_flight_holds, CheckThenInsert, Fake, FakeCache};

#[test]
#[should_panic(expected = "exactly one initialization")]
fn check_then_insert_bug_is_caught() {
    model(|| single_flight_holds(CheckThenInsert::new(Fake::new(0, false)), 2));
}

#[test]
fn the_production_cache_passes_the_same_model() {
    model(|| single_flight_holds(FakeCache::new("g", Fake::new(0, false)), 2));
}
