//! The store workload shared by the criterion bench (`benches/store.rs`)
//! and `store_compare`: set, get and add round trips of 64-byte values
//! against a [`TcpStoreServer`] over loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_store::{ClientOptions, ServerOptions, Store, TcpStore, TcpStoreServer};
use futures::future::join_all;

/// The value every `set` writes.
pub const VALUE: [u8; 64] = {
    let mut v = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        v[i] = i as u8;
        i += 1;
    }
    v
};

/// Keys each client cycles through in `set`.
const KEYS: usize = 16;

/// An operation of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `set(key, 64 bytes)`.
    Set,
    /// `get(key)` of a key that exists.
    Get,
    /// `add(key, 1)`.
    Add,
}

impl Op {
    /// All three, in the order they are reported.
    pub const ALL: [Op; 3] = [Op::Set, Op::Get, Op::Add];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::Get => "get",
            Op::Add => "add",
        }
    }
}

/// A server on 127.0.0.1 and `n` clients connected to it.
#[derive(Debug)]
pub struct Setup {
    /// The server (kept alive).
    pub server: TcpStoreServer,
    /// The clients.
    pub clients: Vec<Arc<TcpStore>>,
}

impl Setup {
    /// Starts a server and connects `n` clients; each client's `get` key
    /// exists.
    pub async fn new(n: usize) -> Setup {
        let server = TcpStoreServer::bind(
            "127.0.0.1:0".parse().expect("literal address"),
            ServerOptions::default(),
        )
        .await
        .expect("bind store server on loopback");
        let addr = server.local_addr().to_string();
        let mut clients = Vec::new();
        for i in 0..n {
            let c = TcpStore::connect(&addr, ClientOptions::default())
                .await
                .expect("connect to store server");
            c.set(&format!("k{i}_0"), &VALUE).await.expect("set");
            clients.push(Arc::new(c));
        }
        Setup { server, clients }
    }
}

/// Runs `iters` ops of `op` on client `idx`, one at a time.
pub async fn run_ops(c: &TcpStore, idx: usize, op: Op, iters: u64) {
    let get_key = format!("k{idx}_0");
    let set_keys: Vec<String> = (0..KEYS).map(|k| format!("k{idx}_{k}")).collect();
    let ctr = format!("ctr{idx}");
    for n in 0..iters {
        match op {
            Op::Set => c
                .set(&set_keys[n as usize % KEYS], &VALUE)
                .await
                .expect("set"),
            Op::Get => {
                let v = c.get(&get_key, Duration::from_secs(60)).await.expect("get");
                debug_assert_eq!(v.len(), 64);
            }
            Op::Add => {
                c.add(&ctr, 1).await.expect("add");
            }
        }
    }
}

/// Runs `op` on every client, `inflight` concurrent loops per client, for
/// about `secs`; returns ops/s over all clients.
pub async fn ops_per_sec(setup: &Setup, op: Op, inflight: usize, secs: f64) -> f64 {
    // Warm up.
    join_all(
        setup
            .clients
            .iter()
            .enumerate()
            .map(|(i, c)| run_ops(c, i, op, 200)),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let counts = join_all(setup.clients.iter().enumerate().flat_map(|(i, c)| {
        (0..inflight).map(move |_| async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                run_ops(c, i, op, 64).await;
                n += 64;
            }
            n
        })
    }))
    .await;
    counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64()
}
