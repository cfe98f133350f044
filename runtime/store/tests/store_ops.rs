//! Every store operation, on every store: the in-memory store, the TCP
//! client/server, and prefix stores over both.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chorus_store::{
    ClientOptions, InMemoryStore, PrefixStore, ServerOptions, Store, StoreError, TcpStore,
    TcpStoreServer,
};
use futures::future::join_all;
use rand::{Rng, RngCore};

const SHORT: Duration = Duration::from_millis(100);
const LONG: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Tcp,
    PrefixMemory,
    PrefixTcp,
}

const KINDS: [Kind; 4] = [Kind::Memory, Kind::Tcp, Kind::PrefixMemory, Kind::PrefixTcp];

/// `n` handles onto one store (separate connections for TCP), plus what
/// keeps it alive, plus a handle to the whole underlying store.
struct Fixture {
    handles: Vec<Arc<dyn Store>>,
    raw: Arc<dyn Store>,
    _server: Option<TcpStoreServer>,
}

async fn tcp_clients(n: usize) -> (TcpStoreServer, Vec<Arc<dyn Store>>) {
    let server = TcpStoreServer::bind(
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        ServerOptions::default(),
    )
    .await
    .unwrap();
    let addr = server.local_addr().to_string();
    let clients = join_all((0..n).map(|_| TcpStore::connect(&addr, ClientOptions::default())))
        .await
        .into_iter()
        .map(|c| Arc::new(c.unwrap()) as Arc<dyn Store>)
        .collect();
    (server, clients)
}

async fn fixture(kind: Kind, n: usize) -> Fixture {
    match kind {
        Kind::Memory | Kind::PrefixMemory => {
            let m = InMemoryStore::new();
            let raw: Arc<dyn Store> = Arc::new(m.clone());
            let mut handles: Vec<Arc<dyn Store>> = (0..n)
                .map(|_| Arc::new(m.clone()) as Arc<dyn Store>)
                .collect();
            if matches!(kind, Kind::PrefixMemory) {
                handles = handles
                    .into_iter()
                    .map(|h| Arc::new(PrefixStore::new("grp", h)) as Arc<dyn Store>)
                    .collect();
            }
            Fixture {
                handles,
                raw,
                _server: None,
            }
        }
        Kind::Tcp | Kind::PrefixTcp => {
            let (server, mut handles) = tcp_clients(n + 1).await;
            let raw = handles.pop().unwrap();
            if matches!(kind, Kind::PrefixTcp) {
                handles = handles
                    .into_iter()
                    .map(|h| Arc::new(PrefixStore::new("grp", h)) as Arc<dyn Store>)
                    .collect();
            }
            Fixture {
                handles,
                raw,
                _server: Some(server),
            }
        }
    }
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

fn is_prefixed(kind: Kind) -> bool {
    matches!(kind, Kind::PrefixMemory | Kind::PrefixTcp)
}

#[tokio::test]
async fn set_get_overwrite_delete() {
    for kind in KINDS {
        let f = fixture(kind, 2).await;
        let (a, b) = (&f.handles[0], &f.handles[1]);
        let mut reference = std::collections::HashMap::new();
        for i in 0..50 {
            let key = format!("k{}", i % 20);
            let v = random_bytes(rand::thread_rng().gen_range(0..300));
            a.set(&key, &v).await.unwrap();
            reference.insert(key, v);
        }
        for (k, v) in &reference {
            assert_eq!(&b.get(k, SHORT).await.unwrap(), v, "{kind:?} {k}");
        }
        assert_eq!(a.num_keys().await.unwrap(), 20, "{kind:?}");
        assert!(b.delete("k3").await.unwrap(), "{kind:?}");
        assert!(!b.delete("k3").await.unwrap(), "{kind:?}");
        assert!(!a.check(&["k3"]).await.unwrap());
        assert!(a.check(&["k4", "k5"]).await.unwrap());
        assert!(!a.check(&["k4", "k3"]).await.unwrap());
        assert_eq!(a.num_keys().await.unwrap(), 19, "{kind:?}");
        match a.get("k3", SHORT).await {
            Err(StoreError::Timeout { keys, after }) => {
                assert_eq!(keys, vec!["k3".to_owned()], "{kind:?}");
                assert_eq!(after, SHORT);
            }
            other => panic!("{kind:?}: expected timeout, got {other:?}"),
        }
        // Empty values are values.
        a.set("empty", b"").await.unwrap();
        assert_eq!(b.get("empty", SHORT).await.unwrap(), b"");
    }
}

#[tokio::test]
async fn get_is_woken_by_set_from_another_handle() {
    for kind in KINDS {
        let f = fixture(kind, 2).await;
        let (a, b) = (f.handles[0].clone(), f.handles[1].clone());
        let v = random_bytes(64);
        let v2 = v.clone();
        let getter = tokio::spawn(async move { b.get("later", LONG).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        a.set("later", &v).await.unwrap();
        assert_eq!(getter.await.unwrap().unwrap(), v2, "{kind:?}");
    }
}

#[tokio::test]
async fn concurrent_waiters_on_one_key() {
    for kind in KINDS {
        let f = fixture(kind, 4).await;
        let v = random_bytes(100);
        let waiters: Vec<_> = (0..64)
            .map(|i| {
                let s = f.handles[i % 4].clone();
                tokio::spawn(async move {
                    if i % 3 == 0 {
                        s.wait(&["hot"], LONG).await.map(|()| None)
                    } else if i % 3 == 1 {
                        s.get("hot", LONG).await.map(Some)
                    } else {
                        s.multi_get(&["hot", "hot"], LONG).await.map(|mut v| {
                            assert_eq!(v[0], v[1]);
                            v.pop()
                        })
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        f.handles[3].set("hot", &v).await.unwrap();
        for (i, w) in waiters.into_iter().enumerate() {
            match w.await.unwrap().unwrap() {
                Some(got) => assert_eq!(got, v, "{kind:?} waiter {i}"),
                None => assert_eq!(i % 3, 0),
            }
        }
    }
}

#[tokio::test]
async fn add_from_many_clients() {
    for kind in KINDS {
        let f = fixture(kind, 8).await;
        let deltas: Vec<Vec<i64>> = (0..8)
            .map(|_| {
                (0..40)
                    .map(|_| rand::thread_rng().gen_range(1..1_000_000))
                    .collect()
            })
            .collect();
        let expected: i64 = deltas.iter().flatten().sum();
        let results = join_all(f.handles.iter().zip(&deltas).map(|(s, ds)| async move {
            let mut seen = Vec::new();
            for d in ds {
                seen.push(s.add("ctr", *d).await.unwrap());
            }
            seen
        }))
        .await;
        // Every add saw a distinct running total, the largest is the sum.
        let all: Vec<i64> = results.into_iter().flatten().collect();
        let distinct: HashSet<i64> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "{kind:?}");
        assert_eq!(*all.iter().max().unwrap(), expected, "{kind:?}");
        assert_eq!(f.handles[0].add("ctr", 0).await.unwrap(), expected);
        assert_eq!(
            f.handles[1].get("ctr", SHORT).await.unwrap(),
            expected.to_string().into_bytes()
        );
        assert_eq!(f.handles[0].add("neg", -5).await.unwrap(), -5);
        // Not a number.
        f.handles[0].set("text", b"twelve").await.unwrap();
        match f.handles[1].add("text", 1).await {
            Err(StoreError::InvalidValue { key, .. }) => assert_eq!(key, "text", "{kind:?}"),
            other => panic!("{kind:?}: expected InvalidValue, got {other:?}"),
        }
        // Overflow is an error, not a wrap.
        f.handles[0]
            .set("big", i64::MAX.to_string().as_bytes())
            .await
            .unwrap();
        assert!(matches!(
            f.handles[0].add("big", 1).await,
            Err(StoreError::InvalidValue { .. })
        ));
        assert_eq!(
            f.handles[0].get("big", SHORT).await.unwrap(),
            i64::MAX.to_string().into_bytes()
        );
    }
}

#[tokio::test]
async fn compare_set_semantics_and_races() {
    for kind in KINDS {
        let f = fixture(kind, 8).await;
        let s = &f.handles[0];
        // Missing key, non-empty expected: nothing stored.
        assert_eq!(s.compare_set("c", b"x", b"y").await.unwrap(), b"");
        assert!(!s.check(&["c"]).await.unwrap(), "{kind:?}");
        // Missing key, empty expected: stored.
        assert_eq!(s.compare_set("c", b"", b"one").await.unwrap(), b"one");
        // Mismatch: current value back, unchanged.
        assert_eq!(s.compare_set("c", b"two", b"three").await.unwrap(), b"one");
        // Match: swapped.
        assert_eq!(s.compare_set("c", b"one", b"two").await.unwrap(), b"two");
        assert_eq!(s.get("c", SHORT).await.unwrap(), b"two");

        // Race: all clients try to claim the same key; one wins, everyone
        // sees the winner's value.
        for round in 0..5 {
            let key = format!("race{round}");
            let claims: Vec<Vec<u8>> = (0..8).map(|_| random_bytes(16)).collect();
            let got = join_all(f.handles.iter().zip(&claims).map(|(h, c)| {
                let key = key.clone();
                async move { h.compare_set(&key, b"", c).await.unwrap() }
            }))
            .await;
            let winner = got[0].clone();
            assert!(got.iter().all(|g| *g == winner), "{kind:?}");
            assert!(claims.contains(&winner), "{kind:?}");
            assert_eq!(s.get(&key, SHORT).await.unwrap(), winner);
        }
    }
}

#[tokio::test]
async fn wait_and_multi_ops() {
    for kind in KINDS {
        let f = fixture(kind, 2).await;
        let (a, b) = (f.handles[0].clone(), f.handles[1].clone());
        let values: Vec<Vec<u8>> = (0..10).map(|i| random_bytes(10 + i)).collect();
        let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        let entries: Vec<(&str, &[u8])> = names
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        a.multi_set(&entries).await.unwrap();
        let keys: Vec<&str> = names.iter().rev().map(String::as_str).collect();
        let got = b.multi_get(&keys, SHORT).await.unwrap();
        let want: Vec<Vec<u8>> = values.iter().rev().cloned().collect();
        assert_eq!(got, want, "{kind:?}");
        b.wait(&keys, SHORT).await.unwrap();
        assert!(b.check(&keys).await.unwrap());
        assert!(b.multi_get(&[], SHORT).await.unwrap().is_empty());

        // Timeout names only the missing keys.
        match b.wait(&["m1", "nope1", "m2", "nope2"], SHORT).await {
            Err(StoreError::Timeout { mut keys, .. }) => {
                keys.sort();
                assert_eq!(
                    keys,
                    vec!["nope1".to_owned(), "nope2".to_owned()],
                    "{kind:?}"
                );
            }
            other => panic!("{kind:?}: expected timeout, got {other:?}"),
        }
        match b.multi_get(&["m1", "nope3"], SHORT).await {
            Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, vec!["nope3".to_owned()]),
            other => panic!("{kind:?}: expected timeout, got {other:?}"),
        }

        // A wait on several keys is woken only when the last one appears.
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.multi_get(&["w1", "w2", "w3"], LONG).await });
        a.set("w1", b"1").await.unwrap();
        a.set("w3", b"3").await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished(), "{kind:?}");
        a.multi_set(&[("w2", b"2")]).await.unwrap();
        assert_eq!(
            waiter.await.unwrap().unwrap(),
            vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
        );
    }
}

#[tokio::test]
async fn num_keys_and_prefix_isolation() {
    for kind in KINDS {
        let f = fixture(kind, 1).await;
        let s = &f.handles[0];
        // Keys outside any prefix, set on the raw store.
        for i in 0..5 {
            f.raw.set(&format!("other/{i}"), b"x").await.unwrap();
        }
        for i in 0..7 {
            s.set(&format!("mine{i}"), b"y").await.unwrap();
        }
        let n = s.num_keys().await.unwrap();
        if is_prefixed(kind) {
            assert_eq!(n, 7, "{kind:?}");
            assert_eq!(f.raw.num_keys().await.unwrap(), 12);
            assert_eq!(f.raw.get("grp/mine3", SHORT).await.unwrap(), b"y");
            // Another group over the same store sees none of these keys.
            let other = PrefixStore::new("grp2", f.raw.clone());
            assert_eq!(other.num_keys().await.unwrap(), 0);
            assert!(!other.check(&["mine0"]).await.unwrap());
            match other.get("mine0", SHORT).await {
                Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, vec!["mine0".to_owned()]),
                r => panic!("{kind:?}: {r:?}"),
            }
            // Nested prefixes count their own keys only.
            let nested = PrefixStore::new("sub", s.clone());
            nested.set("a", b"1").await.unwrap();
            assert_eq!(nested.num_keys().await.unwrap(), 1);
            assert_eq!(f.raw.get("grp/sub/a", SHORT).await.unwrap(), b"1");
            assert_eq!(s.num_keys().await.unwrap(), 8);
        } else {
            assert_eq!(n, 12, "{kind:?}");
            assert_eq!(s.num_keys_with_prefix("other/").await.unwrap(), 5);
        }
    }
}

#[tokio::test]
async fn limits_are_enforced() {
    use chorus_store::{MAX_KEY_LEN, MAX_VALUE_LEN};
    for kind in KINDS {
        let f = fixture(kind, 1).await;
        let s = &f.handles[0];
        let long_key = "k".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(
            s.set(&long_key, b"v").await,
            Err(StoreError::TooLarge { what: "key", .. })
        ));
        let big = vec![7u8; MAX_VALUE_LEN + 1];
        assert!(matches!(
            s.set("k", &big).await,
            Err(StoreError::TooLarge { what: "value", .. })
        ));
        // A value at the limit goes through (over TCP: the slow case).
        if matches!(kind, Kind::Tcp) {
            let mut max = random_bytes(4096).repeat(MAX_VALUE_LEN / 4096);
            max[MAX_VALUE_LEN - 1] ^= 0x5a;
            s.set("max", &max).await.unwrap();
            let got = s.get("max", LONG).await.unwrap();
            assert!(got == max, "{kind:?}: 8 MiB value differs");
        }
        // The store still works.
        s.set("k", b"v").await.unwrap();
        assert_eq!(s.get("k", SHORT).await.unwrap(), b"v");
    }
}

#[tokio::test]
async fn cancelled_waits_leave_nothing_behind() {
    for kind in KINDS {
        let f = fixture(kind, 1).await;
        let s = &f.handles[0];
        for _ in 0..20 {
            let r = tokio::time::timeout(Duration::from_millis(2), s.get("never", LONG)).await;
            assert!(r.is_err());
        }
        // The store still answers, and a later set / get pair works.
        s.set("never", b"now").await.unwrap();
        assert_eq!(s.get("never", SHORT).await.unwrap(), b"now", "{kind:?}");
    }
}

#[tokio::test]
async fn present_says_which_keys_exist_in_order_as_check_would() {
    for kind in KINDS {
        let f = fixture(kind, 2).await;
        let (a, b) = (&f.handles[0], &f.handles[1]);
        let keys: Vec<String> = (0..300).map(|i| format!("alive/{i}")).collect();
        let mut want = vec![false; keys.len()];
        for i in (0..300).filter(|i| i % 7 == 3 || i % 11 == 0) {
            a.set(&keys[i], b"1").await.unwrap();
            want[i] = true;
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(b.present(&refs).await.unwrap(), want, "{kind:?}");
        // The same answer as check, key by key.
        for (k, &w) in refs.iter().zip(&want) {
            assert_eq!(b.check(&[k]).await.unwrap(), w, "{kind:?} {k}");
        }
        assert_eq!(b.present(&[]).await.unwrap(), Vec::<bool>::new());
    }
}
