//! Waits for other ranks report while they last: a survivor in `reform`'s
//! quorum says how many ranks announced themselves of how many, and a
//! replacement rank that nobody admits says which epoch it waits for. The
//! reports are `tracing` events (target `chorus::wait`), captured here by
//! a subscriber set for the whole test process. The ranks are tasks of
//! this process; the store is the test's.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chorus::store::{InMemoryStore, Store};
use chorus::{ProcessGroup, ReformError};
use tests_integration::testkit::build_all;

const T: Duration = Duration::from_secs(10);

/// Every report so far, one per line.
static CAPTURED: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sets the capturing subscriber (once) and a short report period.
fn capture() {
    static SET: OnceLock<()> = OnceLock::new();
    SET.get_or_init(|| {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("chorus::wait=info"))
            .with_writer(|| Capture)
            .with_ansi(false)
            .init();
        chorus::wait_report::set_every(Duration::from_millis(100));
    });
}

/// The captured reports that contain `text`.
fn reports(text: &str) -> Vec<String> {
    let all = CAPTURED.lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&all)
        .lines()
        .filter(|l| l.contains(text))
        .map(str::to_string)
        .collect()
}

async fn groups(name: &str, size: usize, store: &Arc<dyn Store>) -> Vec<ProcessGroup> {
    build_all(size, |rank| {
        ProcessGroup::builder()
            .name(name)
            .rank(rank)
            .world_size(size)
            .store(store.clone())
            .timeout(T)
    })
    .await
}

/// Rank 1 of 2 dies; rank 0 re-forms alone, after its window: while it
/// waits it says for what, where and how far the quorum got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_waiting_in_the_quorum_reports_who_announced() {
    capture();
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let mut gs = groups("waits-reform", 2, &store).await;
    let dead = gs.pop().unwrap();
    dead.abort("this rank dies");
    drop(dead);
    let g = gs.pop().unwrap();
    let window = Duration::from_millis(1500);
    let new = g.reform(window).await.expect("re-formed alone");
    assert_eq!((new.size(), new.epoch()), (1, 1));
    let got = reports(
        "rank 0 of group 'waits-reform' waits for its 2 ranks to agree on epoch 1 (store keys \
         chorus/group/waits-reform/reform/1/): 1 of 2 ranks announced themselves, 0 replacement \
         rank(s) wait to join; waited ",
    );
    assert!(!got.is_empty(), "{}", reports("waits-reform").join("\n"));
    assert!(
        got[0].contains("every survivor must call reform (or admit)"),
        "{}",
        got[0]
    );
}

/// A replacement nobody admits says which epoch it waits for and how
/// long it has waited, until it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_nobody_admits_reports_its_wait() {
    capture();
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let gs = groups("waits-rejoin", 2, &store).await;
    let e = ProcessGroup::builder()
        .name("waits-rejoin")
        .rank(1)
        .world_size(2)
        .store(store.clone())
        .rejoin_timeout(Duration::from_millis(1200))
        .rejoin()
        .await
        .expect_err("nobody admits it");
    assert!(
        matches!(e, chorus::Error::Reform(ReformError::NotAdmitted { .. })),
        "{e}"
    );
    let got = reports(
        "world rank 1 waits to be admitted into group 'waits-rejoin' as a replacement rank \
         (store keys chorus/group/waits-rejoin/reform/<epoch>/): epoch 1: 1 replacement rank(s) \
         announced, roster not closed yet; waited ",
    );
    assert!(!got.is_empty(), "{}", reports("waits-rejoin").join("\n"));
    assert!(got[0].contains("of at most 1.2s"), "{}", got[0]);
    drop(gs);
}
