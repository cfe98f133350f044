//! The suite can fail: a deliberately broken cache (check, unlock, then
//! insert without checking again) must be caught by the single-flight model.
#![cfg(loom)]

use chorus_core::comm_cache::CommKey;
use chorus_loom_tests::{model, Fake, FakeCache};
use loom::future::block_on;
use loom::sync::Arc;
use loom::thread;

#[test]
#[should_panic(expected = "exactly one initialization")]
fn check_then_insert_bug_is_caught() {
    model(|| {
        let cache = Arc::new(FakeCache::new_with_check_then_insert_bug(
            "g",
            Fake::new(0, false),
        ));
        let c2 = cache.clone();
        let h = thread::spawn(move || block_on(c2.get(CommKey::devices([0]))).map(|_| ()));
        let mine = block_on(cache.get(CommKey::devices([0]))).map(|_| ());
        let theirs = h.join().expect("caller thread");
        assert!(mine.is_ok() && theirs.is_ok());
        assert_eq!(cache.created(), 1, "exactly one initialization");
    });
}
