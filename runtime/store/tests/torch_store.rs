//! [`TorchStore`] against a real `torch.distributed.TCPStore` server, and
//! against PyTorch's own client on the same server.
//!
//! These tests need a Python with PyTorch: `CHORUS_TORCH_PYTHON` names it
//! (default `python3`). They are ignored by default; CI runs them with
//! `cargo nextest run -p chorus-store --test torch_store --run-ignored only`
//! after installing PyTorch, and a missing PyTorch then fails them.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_store::{PrefixStore, Store, StoreError, TorchStore, TorchStoreOptions};

const SHORT: Duration = Duration::from_millis(200);
const LONG: Duration = Duration::from_secs(20);

/// A PyTorch TCPStore server in a Python process, and a line protocol to
/// PyTorch's own client on it (tests/support/torch_store_server.py).
struct Torch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    port: u16,
}

impl Torch {
    fn start() -> Torch {
        let python = std::env::var("CHORUS_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/torch_store_server.py"
        );
        let mut child = Command::new(&python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            panic!("{python} did not start a TCPStore (is PyTorch installed?): {line:?}")
        });
        Torch {
            child,
            stdin,
            stdout,
            port,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// One command to PyTorch's client; its one-line answer.
    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        let mut out = String::new();
        self.stdout.read_line(&mut out).unwrap();
        out.trim().to_owned()
    }

    async fn client(&self) -> TorchStore {
        TorchStore::connect(&self.addr(), TorchStoreOptions::default())
            .await
            .unwrap()
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn every_operation_against_pytorchs_server() {
    let torch = Torch::start();
    let s = torch.client().await;

    // set / get, any bytes.
    let bin: Vec<u8> = (0..=255).collect();
    s.set("bin", &bin).await.unwrap();
    assert_eq!(s.get("bin", SHORT).await.unwrap(), bin);
    s.set("bin", b"").await.unwrap();
    assert_eq!(s.get("bin", SHORT).await.unwrap(), b"");

    // add: missing counts as 0, decimal text.
    assert_eq!(s.add("n", 5).await.unwrap(), 5);
    assert_eq!(s.add("n", -7).await.unwrap(), -2);
    assert_eq!(s.get("n", SHORT).await.unwrap(), b"-2");

    // compare_set, all four cases of chorus's contract.
    assert_eq!(s.compare_set("cs", b"", b"a").await.unwrap(), b"a"); // missing, empty expected: set
    assert_eq!(s.compare_set("cs", b"x", b"b").await.unwrap(), b"a"); // mismatch: current
    assert_eq!(s.compare_set("cs", b"a", b"b").await.unwrap(), b"b"); // match: swapped
    assert_eq!(s.compare_set("none", b"x", b"y").await.unwrap(), b""); // missing: empty
    assert_eq!(s.compare_set("none", b"x", b"x").await.unwrap(), b"");
    assert_eq!(s.compare_set("cs", b"b", b"b").await.unwrap(), b"b");
    assert!(!s.check(&["none"]).await.unwrap());

    // check / wait / delete.
    assert!(s.check(&["bin", "n"]).await.unwrap());
    assert!(!s.check(&["bin", "nope"]).await.unwrap());
    assert!(s.check(&[]).await.unwrap());
    s.wait(&["bin", "cs"], SHORT).await.unwrap();
    assert!(s.delete("cs").await.unwrap());
    assert!(!s.delete("cs").await.unwrap());

    // multi_set / multi_get.
    let entries: [(&str, &[u8]); 3] = [("m/a", b"1"), ("m/b", b""), ("m/c", b"333")];
    s.multi_set(&entries).await.unwrap();
    let got = s.multi_get(&["m/c", "m/a", "m/b"], SHORT).await.unwrap();
    assert_eq!(got, vec![b"333".to_vec(), b"1".to_vec(), vec![]]);
    assert!(s.multi_get(&[], SHORT).await.unwrap().is_empty());
    s.multi_set(&[]).await.unwrap();

    // num_keys counts the server's keys; what PyTorch's client sees agrees.
    let mut torch = torch;
    let theirs: u64 = torch.cmd("num_keys").parse().unwrap();
    assert_eq!(s.num_keys().await.unwrap(), theirs);
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn values_cross_between_pytorchs_client_and_chorus() {
    let mut torch = Torch::start();
    let s = torch.client().await;
    let bytes = [0u8, 1, 0xff, b'\n', b' '];

    s.set("from/chorus", &bytes).await.unwrap();
    assert_eq!(torch.cmd("get from/chorus"), hex(&bytes));
    assert_eq!(torch.cmd(&format!("set from/torch {}", hex(&bytes))), "ok");
    assert_eq!(s.get("from/torch", SHORT).await.unwrap(), bytes);

    // One counter, both clients.
    assert_eq!(s.add("count", 2).await.unwrap(), 2);
    assert_eq!(torch.cmd("add count 3"), "5");
    assert_eq!(s.add("count", 0).await.unwrap(), 5);
    assert_eq!(torch.cmd("check from/chorus count"), "1");
    assert_eq!(torch.cmd("check from/chorus nothing"), "0");
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn a_waiting_get_is_woken_by_pytorchs_set() {
    let mut torch = Torch::start();
    let s = Arc::new(torch.client().await);
    let waiter = {
        let s = Arc::clone(&s);
        tokio::spawn(async move { s.get("later", LONG).await })
    };
    let w2 = {
        let s = Arc::clone(&s);
        tokio::spawn(async move { s.multi_get(&["later", "later2"], LONG).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Operations go on while the others wait (each holds a connection).
    s.set("meanwhile", b"x").await.unwrap();
    assert!(!waiter.is_finished());
    let t = Instant::now();
    assert_eq!(torch.cmd("set later 6869"), "ok");
    assert_eq!(waiter.await.unwrap().unwrap(), b"hi");
    assert!(t.elapsed() < LONG);
    assert!(!w2.is_finished());
    assert_eq!(torch.cmd("set later2 00"), "ok");
    assert_eq!(w2.await.unwrap().unwrap(), vec![b"hi".to_vec(), vec![0]]);
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn timeouts_name_the_missing_keys_and_leave_the_store_usable() {
    let torch = Torch::start();
    let opts = TorchStoreOptions {
        max_idle: 1,
        ..TorchStoreOptions::default()
    };
    let s = TorchStore::connect(&torch.addr(), opts).await.unwrap();
    s.set("here", b"1").await.unwrap();
    let t = Instant::now();
    match s.get("absent", SHORT).await {
        Err(StoreError::Timeout { keys, after }) => {
            assert_eq!(keys, ["absent"]);
            assert_eq!(after, SHORT);
        }
        r => panic!("expected a timeout, got {r:?}"),
    }
    assert!(t.elapsed() >= SHORT);
    match s.wait(&["here", "gone", "lost"], SHORT).await {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, ["gone", "lost"]),
        r => panic!("expected a timeout, got {r:?}"),
    }
    match s.multi_get(&["here", "gone"], SHORT).await {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, ["gone"]),
        r => panic!("expected a timeout, got {r:?}"),
    }
    // The cancelled waits left the (single pooled) connection in step.
    assert_eq!(s.get("here", SHORT).await.unwrap(), b"1");
    assert_eq!(s.add("k", 1).await.unwrap(), 1);
    // A late set after a cancelled wait does not confuse the next reply.
    s.set("absent", b"late").await.unwrap();
    assert_eq!(s.get("absent", SHORT).await.unwrap(), b"late");
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn bad_requests_fail_typed_and_lose_nothing() {
    let torch = Torch::start();
    let s = torch.client().await;
    s.set("text", b"not a number").await.unwrap();
    match s.add("text", 1).await {
        Err(StoreError::InvalidValue { key, .. }) => assert_eq!(key, "text"),
        r => panic!("expected InvalidValue, got {r:?}"),
    }
    // Refused before anything is sent.
    let long = "k".repeat(chorus_store::MAX_KEY_LEN + 1);
    assert!(matches!(
        s.set(&long, b"").await,
        Err(StoreError::TooLarge { what: "key", .. })
    ));
    let big = vec![0u8; chorus_store::MAX_VALUE_LEN + 1];
    assert!(matches!(
        s.set("big", &big).await,
        Err(StoreError::TooLarge { what: "value", .. })
    ));
    // The store is intact and still serves.
    assert_eq!(s.get("text", SHORT).await.unwrap(), b"not a number");
    assert!(!s.check(&["big"]).await.unwrap());
    // The largest value passes whole.
    let max = vec![7u8; chorus_store::MAX_VALUE_LEN];
    s.set("max", &max).await.unwrap();
    assert_eq!(s.get("max", SHORT).await.unwrap(), max);
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn prefix_stores_over_it_keep_groups_apart() {
    let mut torch = Torch::start();
    let s: Arc<dyn Store> = Arc::new(torch.client().await);
    let a = PrefixStore::new("a", Arc::clone(&s));
    let b = PrefixStore::new("b", Arc::clone(&s));
    a.set("k", b"A").await.unwrap();
    b.set("k", b"B").await.unwrap();
    assert_eq!(a.get("k", SHORT).await.unwrap(), b"A");
    assert_eq!(torch.cmd("get b/k"), hex(b"B"));
    assert!(matches!(
        a.num_keys().await,
        Err(StoreError::Unsupported { .. })
    ));
}

#[tokio::test]
async fn a_server_that_is_not_a_torch_store_is_refused() {
    // A listener that accepts and says nothing: the ping goes unanswered.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let hold = tokio::spawn(async move {
        let (sock, _) = l.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(sock);
    });
    let opts = TorchStoreOptions {
        request_timeout: SHORT,
        ..TorchStoreOptions::default()
    };
    match TorchStore::connect(&addr, opts).await {
        Err(StoreError::Protocol(msg)) => assert!(msg.contains("PyTorch TCPStore"), "{msg}"),
        r => panic!("expected a protocol error, got {r:?}"),
    }
    hold.abort();
}

#[tokio::test]
async fn connect_gives_up_after_its_timeout() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let opts = TorchStoreOptions {
        connect_timeout: Duration::from_millis(300),
        ..TorchStoreOptions::default()
    };
    let t = Instant::now();
    let r = TorchStore::connect(&format!("127.0.0.1:{port}"), opts).await;
    assert!(matches!(r, Err(StoreError::Connection { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// Joins `world` ranks through the PyTorch store under `namespace`.
async fn join_all_ranks(
    torch: &Torch,
    world: usize,
    namespace: &str,
) -> Vec<chorus_store::rendezvous::Rendezvous> {
    use chorus_store::rendezvous::{rendezvous, RendezvousConfig};
    let tasks: Vec<_> = (0..world)
        .map(|rank| {
            let cfg = RendezvousConfig::builder()
                .rank(rank)
                .world_size(world)
                .master_addr("127.0.0.1")
                .master_port(torch.port)
                .timeout(LONG)
                .torch_store(namespace)
                .build()
                .unwrap();
            tokio::spawn(rendezvous(cfg))
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().unwrap());
    }
    out
}

#[tokio::test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
async fn ranks_rendezvous_through_a_pytorch_store_once_per_namespace() {
    use chorus_store::rendezvous::{rendezvous, RendezvousConfig, RendezvousError};
    let mut torch = Torch::start();
    let ranks = join_all_ranks(&torch, 3, "chorus/run/0").await;
    // The job's store is shared: what one rank sets, the others get.
    ranks[2].store().set("hello", b"from 2").await.unwrap();
    assert_eq!(
        ranks[0].store().get("hello", SHORT).await.unwrap(),
        b"from 2"
    );
    // Under the namespace, where PyTorch's client finds it too.
    assert_eq!(torch.cmd("get chorus/run/0/hello"), hex(b"from 2"));

    // A second process claiming a joined rank in the same namespace fails.
    let dup = RendezvousConfig::builder()
        .rank(1)
        .world_size(3)
        .master_addr("127.0.0.1")
        .master_port(torch.port)
        .timeout(SHORT)
        .torch_store("chorus/run/0")
        .build()
        .unwrap();
    assert!(matches!(
        rendezvous(dup).await,
        Err(RendezvousError::DuplicateRank { rank: 1 })
    ));

    // The next attempt starts clean in its own namespace.
    let again = join_all_ranks(&torch, 3, "chorus/run/1").await;
    assert!(!again[0].store().check(&["hello"]).await.unwrap());

    // Nobody hosts the store, so leaving does not wait for the others.
    let t = Instant::now();
    for r in ranks.into_iter().chain(again).rev() {
        r.shutdown().await.unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(5));
}
