//! The TCP store server and client: many connections, bad input, tokens,
//! executors, shutdown, connect retries.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_store::{
    ClientOptions, InMemoryStore, ServerOptions, Store, StoreError, TcpStore, TcpStoreServer,
};
use futures::future::join_all;
use rand::{Rng, RngCore, SeedableRng};

const SHORT: Duration = Duration::from_millis(100);
const LONG: Duration = Duration::from_secs(20);

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn server(opts: ServerOptions) -> TcpStoreServer {
    TcpStoreServer::bind(localhost(), opts).await.unwrap()
}

fn client_opts(token: Option<&str>) -> ClientOptions {
    ClientOptions {
        token: token.map(str::to_owned),
        connect_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    }
}

async fn client(s: &TcpStoreServer, token: Option<&str>) -> TcpStore {
    TcpStore::connect(&s.local_addr().to_string(), client_opts(token))
        .await
        .unwrap()
}

// ------------------------------------------------------------ raw frames

const VERSION: u8 = 1;
const OP_HELLO: u8 = 1;
const OP_SET: u8 = 2;
const OP_GET: u8 = 3;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 0x80;
const ERR_AUTH: u8 = 2;
const ERR_TOO_LARGE: u8 = 3;
const ERR_PROTOCOL: u8 = 4;

fn frame(kind: u8, id: u64, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&((10 + body.len()) as u32).to_le_bytes());
    f.push(VERSION);
    f.push(kind);
    f.extend_from_slice(&id.to_le_bytes());
    f.extend_from_slice(body);
    f
}

fn field(b: &[u8]) -> Vec<u8> {
    let mut f = (b.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(b);
    f
}

fn set_frame(id: u64, key: &str, value: &[u8]) -> Vec<u8> {
    let mut body = field(key.as_bytes());
    body.extend(field(value));
    frame(OP_SET, id, &body)
}

fn raw(s: &TcpStoreServer) -> TcpStream {
    let sock = TcpStream::connect(s.local_addr()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock
}

/// Reads one frame: (kind, id, body); None at EOF or reset.
/// A fake server on a thread: accepts one client, answers its hello, then
/// hands the connection to `then`. Its address and thread.
fn fake_server(
    then: impl FnOnce(TcpStream) + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind(localhost()).unwrap();
    let addr = l.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut sock, _) = l.accept().unwrap();
        let _hello = read_frame(&mut sock).unwrap();
        sock.write_all(&frame(STATUS_OK, 1, b"")).unwrap();
        then(sock);
    });
    (addr, fake)
}

fn read_frame(sock: &mut TcpStream) -> Option<(u8, u64, Vec<u8>)> {
    let mut head = [0u8; 14];
    sock.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    assert_eq!(head[4], VERSION);
    let mut body = vec![0u8; len - 10];
    sock.read_exact(&mut body).ok()?;
    Some((
        head[5],
        u64::from_le_bytes(head[6..14].try_into().unwrap()),
        body,
    ))
}

/// Asserts the server closes the connection (EOF or reset) soon.
fn assert_closed(sock: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    let start = Instant::now();
    loop {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "server kept the connection"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "server kept the connection"
    );
}

/// Asserts an error frame with `code` arrives, then the connection closes.
fn assert_error_then_closed(sock: &mut TcpStream, code: u8) {
    let (kind, _, body) = read_frame(sock).expect("an error frame before the close");
    assert_eq!(kind, STATUS_ERROR);
    assert_eq!(body[0], code, "error frame {body:?}");
    assert_closed(sock);
}

/// A well-behaved client still gets correct answers.
async fn check_good(good: &TcpStore, round: u64) {
    let mut v = vec![0u8; 64];
    rand::thread_rng().fill_bytes(&mut v);
    let key = format!("good{round}");
    good.set(&key, &v).await.unwrap();
    assert_eq!(good.get(&key, SHORT).await.unwrap(), v);
    assert_eq!(
        good.add("good_ctr", 3).await.unwrap(),
        3 * (round as i64 + 1)
    );
}

// ------------------------------------------------------------ tests

fn raise_nofile(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < want {
        // Raising the soft limit up to the hard one is always allowed.
        let _ = setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard);
    }
}

#[tokio::test]
async fn thousand_connections() {
    // Client and server side of every connection live in this process.
    raise_nofile(4096);
    let s = server(ServerOptions::default()).await;
    let addr = s.local_addr().to_string();
    let clients: Vec<TcpStore> =
        join_all((0..1000).map(|_| TcpStore::connect(&addr, client_opts(None))))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let clients: Vec<Arc<TcpStore>> = clients.into_iter().map(Arc::new).collect();
    // Every connection waits on one key, then adds and sets its own key.
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.clone();
            tokio::spawn(async move {
                let go = c.get("go", LONG).await.unwrap();
                c.set(&format!("c{i}"), &go).await.unwrap();
                c.add("n", i as i64 + 1).await.unwrap()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    clients[0].set("go", b"start").await.unwrap();
    let mut totals: Vec<i64> = join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    totals.sort();
    totals.dedup();
    assert_eq!(totals.len(), 1000);
    let expected: i64 = (1..=1000).sum();
    assert_eq!(*totals.last().unwrap(), expected);
    assert_eq!(clients[999].num_keys().await.unwrap(), 1002);
    let keys: Vec<String> = (0..1000).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let vals = clients[500].multi_get(&refs, SHORT).await.unwrap();
    assert!(vals.iter().all(|v| v == b"start"));
}

#[tokio::test]
async fn bad_input_does_not_hurt_other_clients() {
    let s = server(ServerOptions {
        frame_timeout: Duration::from_millis(300),
        ..ServerOptions::default()
    })
    .await;
    let good = Arc::new(client(&s, None).await);
    // A waiting get that must survive everything below.
    let g2 = good.clone();
    let waiter = tokio::spawn(async move { g2.get("after", LONG).await });
    let mut round = 0;

    // Random bytes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::thread_rng().gen());
    for _ in 0..20 {
        let mut sock = raw(&s);
        let n = rng.gen_range(1..4096);
        let mut junk = vec![0u8; n];
        rng.fill_bytes(&mut junk);
        let _ = sock.write_all(&junk);
        let _ = sock.shutdown(Shutdown::Write);
        assert_closed(&mut sock);
    }
    check_good(&good, round).await;
    round += 1;

    // Truncated frame, then disconnect: nothing is written.
    let full = set_frame(7, "trunc", b"value");
    for cut in [1, 4, 5, 13, full.len() - 1] {
        let mut sock = raw(&s);
        sock.write_all(&full[..cut]).unwrap();
        drop(sock);
    }
    check_good(&good, round).await;
    round += 1;
    assert!(!good.check(&["trunc"]).await.unwrap());

    // Oversize length prefix: refused from the 4 bytes alone.
    for len in [u32::MAX, (16 << 20) + 1] {
        let mut sock = raw(&s);
        sock.write_all(&len.to_le_bytes()).unwrap();
        assert_error_then_closed(&mut sock, ERR_TOO_LARGE);
    }
    check_good(&good, round).await;
    round += 1;

    // Length shorter than a header; wrong version; unknown opcode; a key
    // length pointing past the frame; trailing bytes.
    let mut wrong_version = set_frame(1, "k", b"v");
    wrong_version[4] = 9;
    let mut past_end = frame(OP_GET, 2, &1000u32.to_le_bytes());
    past_end.extend_from_slice(&[0; 8]);
    let mut trailing = set_frame(3, "k", b"v");
    trailing.push(0);
    let n = trailing.len() as u32 - 4;
    trailing[..4].copy_from_slice(&n.to_le_bytes());
    for bad in [
        3u32.to_le_bytes().to_vec(),
        wrong_version,
        frame(99, 4, b""),
        past_end,
        trailing,
    ] {
        let mut sock = raw(&s);
        sock.write_all(&bad).unwrap();
        assert_error_then_closed(&mut sock, ERR_PROTOCOL);
    }
    check_good(&good, round).await;
    round += 1;
    assert!(!good.check(&["k"]).await.unwrap());

    // Good frames followed by garbage on the same connection: the good
    // ones are answered, then the error, then the close.
    let mut sock = raw(&s);
    let mut bytes = set_frame(10, "mixed", b"ok");
    bytes.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0x01]);
    sock.write_all(&bytes).unwrap();
    let (kind, id, _) = read_frame(&mut sock).unwrap();
    assert_eq!((kind, id), (STATUS_OK, 10));
    assert_error_then_closed(&mut sock, ERR_TOO_LARGE);
    assert_eq!(good.get("mixed", SHORT).await.unwrap(), b"ok");

    // A client that stalls mid-frame is timed out.
    let mut sock = raw(&s);
    sock.write_all(&set_frame(1, "stall", b"value")[..9])
        .unwrap();
    let start = Instant::now();
    assert_error_then_closed(&mut sock, ERR_PROTOCOL);
    assert!(start.elapsed() >= Duration::from_millis(250));
    check_good(&good, round).await;
    round += 1;

    // A client that disconnects while its get waits.
    let mut sock = raw(&s);
    let mut body = field(b"gone");
    body.extend_from_slice(&60_000u64.to_le_bytes());
    sock.write_all(&frame(OP_GET, 5, &body)).unwrap();
    drop(sock);
    check_good(&good, round).await;
    round += 1;

    // Many bad clients at once, while the good one pipelines.
    let bad: Vec<_> = (0..50u64)
        .map(|i| {
            let addr = s.local_addr();
            std::thread::spawn(move || {
                let mut sock = TcpStream::connect(addr).unwrap();
                sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut junk = vec![0u8; 512];
                rand::rngs::StdRng::seed_from_u64(i).fill_bytes(&mut junk);
                junk[..4].copy_from_slice(&u32::MAX.to_le_bytes());
                let _ = sock.write_all(&junk);
                assert_closed(&mut sock);
            })
        })
        .collect();
    let pipelined = join_all((0..200).map(|i| {
        let good = good.clone();
        async move {
            let k = format!("p{i}");
            good.set(&k, k.as_bytes()).await.unwrap();
            good.get(&k, SHORT).await.unwrap() == k.as_bytes()
        }
    }))
    .await;
    assert!(pipelined.into_iter().all(|ok| ok));
    for t in bad {
        t.join().unwrap();
    }
    check_good(&good, round).await;

    // The first waiter was served all along.
    assert!(!waiter.is_finished());
    good.set("after", b"done").await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), b"done");
}

#[tokio::test]
async fn token_is_required_before_any_key() {
    let s = server(ServerOptions {
        token: Some("s3cret".into()),
        ..ServerOptions::default()
    })
    .await;
    let good = client(&s, Some("s3cret")).await;
    check_good(&good, 0).await;

    let addr = s.local_addr().to_string();
    for wrong in [Some("s3creT"), Some("s3cret "), Some(""), None] {
        match TcpStore::connect(&addr, client_opts(wrong)).await {
            Err(StoreError::Auth(_)) => {}
            other => panic!("token {wrong:?}: expected Auth error, got {other:?}"),
        }
    }
    // A raw client that skips hello: refused, its set never applied.
    let mut sock = raw(&s);
    sock.write_all(&set_frame(2, "sneaky", b"x")).unwrap();
    assert_error_then_closed(&mut sock, ERR_AUTH);
    // A raw client with a wrong token in hello, followed by a set.
    let mut sock = raw(&s);
    let mut bytes = frame(OP_HELLO, 1, &field(b"guess"));
    bytes.extend(set_frame(2, "sneaky", b"x"));
    sock.write_all(&bytes).unwrap();
    assert_error_then_closed(&mut sock, ERR_AUTH);
    // A large frame before hello is refused from its length alone.
    let mut sock = raw(&s);
    sock.write_all(&(1u32 << 20).to_le_bytes()).unwrap();
    assert_error_then_closed(&mut sock, ERR_TOO_LARGE);

    assert!(!good.check(&["sneaky"]).await.unwrap());
    assert_eq!(good.num_keys().await.unwrap(), 2);
    check_good(&good, 1).await;

    // A token on the client and none on the server is accepted.
    let open = server(ServerOptions::default()).await;
    let c = client(&open, Some("whatever")).await;
    check_good(&c, 0).await;
}

#[test]
fn client_and_stores_work_under_block_on_without_tokio() {
    futures::executor::block_on(async {
        assert!(tokio::runtime::Handle::try_current().is_err());
        let s = server(ServerOptions::default()).await;
        let addr = s.local_addr().to_string();
        let a = TcpStore::connect(&addr, client_opts(None)).await.unwrap();
        let b = TcpStore::connect(&addr, client_opts(None)).await.unwrap();
        check_good(&a, 0).await;

        // A get woken by a set from another thread (another block_on).
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(25));
            futures::executor::block_on(b.set("late", b"hello")).unwrap();
            b
        });
        assert_eq!(a.get("late", LONG).await.unwrap(), b"hello");
        let b = setter.join().unwrap();
        // Timeouts need no tokio context either.
        assert!(matches!(
            b.get("missing", Duration::from_millis(50)).await,
            Err(StoreError::Timeout { .. })
        ));
        assert!(matches!(
            a.wait(&["late", "missing"], Duration::from_millis(50))
                .await,
            Err(StoreError::Timeout { .. })
        ));

        // The in-memory store too.
        let m = InMemoryStore::new();
        let m2 = m.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(25));
            futures::executor::block_on(m2.set("k", b"v")).unwrap();
        });
        assert_eq!(m.get("k", LONG).await.unwrap(), b"v");
        setter.join().unwrap();
        assert!(matches!(
            m.get("nope", Duration::from_millis(50)).await,
            Err(StoreError::Timeout { .. })
        ));

        // The server's own table is the one the clients see.
        assert_eq!(s.local_store().get("late", SHORT).await.unwrap(), b"hello");
        s.shutdown().await;
    });
}

#[tokio::test]
async fn pipelined_get_does_not_block_other_ops_on_one_client() {
    let s = server(ServerOptions::default()).await;
    let c = Arc::new(client(&s, None).await);
    let c2 = c.clone();
    let waiter = tokio::spawn(async move { c2.get("p", LONG).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Same connection: these must not queue behind the waiting get.
    check_good(&c, 0).await;
    c.set("p", b"now").await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), b"now");
}

#[tokio::test]
async fn shutdown_fails_waiters_and_later_ops() {
    let s = server(ServerOptions::default()).await;
    let addr = s.local_addr().to_string();
    let c = Arc::new(client(&s, None).await);
    check_good(&c, 0).await;
    let c2 = c.clone();
    let waiter = tokio::spawn(async move { c2.get("never", LONG).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let start = Instant::now();
    s.shutdown().await;
    assert!(matches!(
        waiter.await.unwrap(),
        Err(StoreError::Connection { .. })
    ));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        c.set("x", b"y").await,
        Err(StoreError::Connection { .. })
    ));
    // Nothing listens any more.
    let opts = ClientOptions {
        connect_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    };
    assert!(matches!(
        TcpStore::connect(&addr, opts).await,
        Err(StoreError::Connection { .. })
    ));

    // Dropping a server stops it too.
    let s = server(ServerOptions::default()).await;
    let c = client(&s, None).await;
    drop(s);
    let r = c.get("never", LONG).await;
    assert!(matches!(r, Err(StoreError::Connection { .. })), "{r:?}");
}

#[tokio::test]
async fn connect_retries_until_the_server_is_up() {
    let port = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let connecting = tokio::spawn({
        let addr = addr.clone();
        async move { TcpStore::connect(&addr, client_opts(None)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!connecting.is_finished());
    let s = TcpStoreServer::bind(addr.parse().unwrap(), ServerOptions::default())
        .await
        .unwrap();
    let c = connecting.await.unwrap().unwrap();
    check_good(&c, 0).await;
    assert_eq!(c.local_addr().ip(), s.local_addr().ip());
    assert_ne!(c.local_addr().port(), s.local_addr().port());
    assert_eq!(c.server_addr(), addr);
}

#[tokio::test]
async fn connect_gives_up_after_its_timeout() {
    let port = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap().port()
    };
    let start = Instant::now();
    let r = TcpStore::connect(
        &format!("127.0.0.1:{port}"),
        ClientOptions {
            connect_timeout: Duration::from_millis(300),
            ..ClientOptions::default()
        },
    )
    .await;
    assert!(matches!(r, Err(StoreError::Connection { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        TcpStore::connect(
            "no-such-host.invalid:1",
            ClientOptions {
                connect_timeout: Duration::from_millis(100),
                ..ClientOptions::default()
            }
        )
        .await,
        Err(StoreError::Connection { .. })
    ));
}

#[tokio::test]
async fn a_silent_server_times_out_requests() {
    // Answers hello, then reads and never replies.
    let (addr, fake) = fake_server(move |mut sock| {
        let mut sink = [0u8; 4096];
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        while let Ok(n) = sock.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
    });
    let c = TcpStore::connect(
        &addr.to_string(),
        ClientOptions {
            request_timeout: Duration::from_millis(200),
            ..client_opts(None)
        },
    )
    .await
    .unwrap();
    let start = Instant::now();
    assert!(matches!(
        c.set("k", b"v").await,
        Err(StoreError::Connection { .. })
    ));
    assert!(matches!(
        c.get("k", Duration::from_millis(100)).await,
        Err(StoreError::Connection { .. })
    ));
    assert!(start.elapsed() < Duration::from_secs(3));
    drop(c);
    fake.join().unwrap();
}

#[test]
fn a_request_not_polled_again_still_fails_when_the_server_goes() {
    // The request is alone in flight, so its first poll writes it and starts
    // reading its own reply; then its executor stops polling. The fake
    // server reads it and closes: the I/O threads must fail the request and
    // wake its future without another poll.
    let (addr, fake) = fake_server(move |mut sock| {
        let _get = read_frame(&mut sock).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        sock.shutdown(Shutdown::Both).unwrap();
    });
    let c = futures::executor::block_on(TcpStore::connect(&addr.to_string(), client_opts(None)))
        .unwrap();
    struct Count(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let wakes = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
    let waker = std::task::Waker::from(wakes.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut get = c.get("k", Duration::from_secs(30));
    assert!(get.as_mut().poll(&mut cx).is_pending());
    // The first poll may have woken itself (to read again when polled).
    let after_poll = wakes.0.load(std::sync::atomic::Ordering::SeqCst);
    fake.join().unwrap();
    // Not polled meanwhile: woken by the I/O threads.
    let start = Instant::now();
    while wakes.0.load(std::sync::atomic::Ordering::SeqCst) <= after_poll {
        assert!(start.elapsed() < Duration::from_secs(5), "never woken");
        std::thread::sleep(Duration::from_millis(5));
    }
    match get.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Err(StoreError::Connection { cause, .. })) => {
            assert!(cause.contains("closed"), "{cause}");
        }
        other => panic!("expected a connection error, got {other:?}"),
    }
}

#[tokio::test]
async fn connection_limit_refuses_extra_clients() {
    let s = server(ServerOptions {
        max_connections: 2,
        ..ServerOptions::default()
    })
    .await;
    let a = client(&s, None).await;
    let _b = client(&s, None).await;
    let r = TcpStore::connect(&s.local_addr().to_string(), client_opts(None)).await;
    assert!(r.is_err(), "{r:?}");
    // A raw third connection is told why before the close.
    let mut sock = raw(&s);
    assert_error_then_closed(&mut sock, ERR_PROTOCOL);
    check_good(&a, 0).await;
}

#[tokio::test]
async fn steady_split_frames_are_not_timed_out() {
    // Every read ends inside a frame, but frames keep completing: that is
    // progress, not a stall.
    let s = server(ServerOptions {
        frame_timeout: Duration::from_millis(500),
        ..ServerOptions::default()
    })
    .await;
    let addr = s.local_addr();
    let replies = tokio::task::spawn_blocking(move || {
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let frames: Vec<Vec<u8>> = (0..30)
            .map(|i| set_frame(i + 1, &format!("split{i:02}"), &[i as u8; 40]))
            .collect();
        let bytes: Vec<u8> = frames.concat();
        let step = frames[0].len();
        // Half a frame, then one frame's worth every 25 ms: 750 ms in all,
        // longer than the frame timeout, with gaps 20 times shorter.
        let mut pos = step / 2;
        sock.write_all(&bytes[..pos]).unwrap();
        while pos < bytes.len() {
            std::thread::sleep(Duration::from_millis(25));
            let end = (pos + step).min(bytes.len());
            sock.write_all(&bytes[pos..end]).unwrap();
            pos = end;
        }
        (0..30)
            .map(|_| read_frame(&mut sock).map(|(k, id, _)| (k, id)))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let want: Vec<_> = (1..=30).map(|id| Some((STATUS_OK, id))).collect();
    assert_eq!(replies, want);
    let c = client(&s, None).await;
    assert_eq!(c.get("split29", SHORT).await.unwrap(), vec![29u8; 40]);
}

#[tokio::test]
async fn silent_unauthenticated_connections_are_dropped() {
    let s = server(ServerOptions {
        token: Some("t".into()),
        frame_timeout: Duration::from_millis(200),
        ..ServerOptions::default()
    })
    .await;
    let mut sock = raw(&s);
    let start = Instant::now();
    assert_error_then_closed(&mut sock, ERR_AUTH);
    assert!(start.elapsed() >= Duration::from_millis(150));
    // An authenticated client may stay idle longer than that.
    let c = client(&s, Some("t")).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    check_good(&c, 0).await;
}

#[tokio::test]
async fn a_peer_that_never_answers_hello_fails_connect_in_time() {
    let l = TcpListener::bind(localhost()).unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut sock, _) = l.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut sink = [0u8; 256];
        while let Ok(n) = sock.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
    });
    let start = Instant::now();
    let r = TcpStore::connect(
        &addr.to_string(),
        ClientOptions {
            connect_timeout: Duration::from_millis(300),
            ..ClientOptions::default()
        },
    )
    .await;
    assert!(matches!(r, Err(StoreError::Connection { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(4));
    peer.join().unwrap();
}

// ------------------------------------------------------------ load counters

#[tokio::test]
async fn the_server_counts_requests_bytes_and_time_including_waiting_replies() {
    let s = server(ServerOptions::default()).await;
    let c = client(&s, None).await;
    let c2 = client(&s, None).await;
    let start = s.stats();
    assert_eq!(start.connections, 2);
    c.set("k", b"12345").await.unwrap();
    assert_eq!(c.get("k", LONG).await.unwrap(), b"12345");
    assert_eq!(c.add("n", 2).await.unwrap(), 2);
    // A waiting get counts when it arrives, and its reply when it is sent.
    let waiting = tokio::spawn(async move { c2.get("later", LONG).await });
    tokio::time::sleep(SHORT).await;
    let mid = s.stats().since(&start);
    c.set("later", b"abcdefghij").await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), b"abcdefghij");
    let d = s.stats().since(&start);
    assert_eq!(d.connections, 0);
    assert_eq!(mid.requests, 4, "{mid:?}");
    assert_eq!(d.requests, 5, "{d:?}");
    // Every request frame has a header and a key; every reply a header.
    assert!(d.bytes_in >= 5 * 10 + 1 + 1 + 1 + 5 + 5, "{d:?}");
    assert!(d.bytes_out >= 5 * 10 + 5 + 10, "{d:?}");
    assert!(d.bytes_out > mid.bytes_out + 10, "{mid:?} {d:?}");
    assert!(d.busy > Duration::ZERO && d.busy < LONG, "{d:?}");
    s.shutdown().await;
}
