//! The machine's floor for a small exchange: a blocking ping-pong of the
//! same bytes over the transports the TCP backend and the store use (an
//! abstract Unix socket, loopback TCP with `TCP_NODELAY`), one thread per
//! side, no runtime. `chorus-bench` and `tcp_compare.py` run it
//! beside chorus in the same call, so each figure is read against the floor
//! as the machine is at that moment.
//!
//! Prints one JSON line per transport and size: round-trip median and p99
//! in µs.
//!
//! `unix-spin` is the same over a Unix socket with both sides spinning on
//! non-blocking calls instead of sleeping in them: the floor of an exchange
//! in which no thread ever sleeps (what chorus's small ops do while both
//! ranks' callers are at the op together, each on a core of its own).
//!
//! Between two hosts (`--listen ADDR` on one, `--connect ADDR` on the
//! other, e.g. in two network namespaces) it measures the same over real
//! TCP, and with `--exchange-bytes` the floor of a large all_reduce: both
//! sides sending and receiving that many bytes at once (one writer and one
//! reader thread per side), median time and GB/s each way. The connecting
//! side drives and prints.
//!
//! `pingpong [--transports unix,tcp,unix-spin] [--sizes 4,65536] [--budget-s 1]`
//! `pingpong --listen 10.0.0.1:29614` / `pingpong --connect 10.0.0.1:29614 [--sizes ..] [--exchange-bytes 16777216]`
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "blocking ping-pong floor over a Unix socket and loopback TCP")]
struct Args {
    /// Transports: unix (abstract Unix socket), tcp (loopback), unix-spin
    /// (a Unix socket, both sides spinning instead of sleeping).
    #[arg(long, value_delimiter = ',', default_value = "unix,tcp")]
    transports: Vec<String>,
    /// Message sizes in bytes (each way).
    #[arg(long, value_delimiter = ',', default_value = "4,65536")]
    sizes: Vec<usize>,
    /// Seconds of timed round trips per transport and size.
    #[arg(long, default_value_t = 1.0)]
    budget_s: f64,
    /// Serve one remote peer on this address (it says what to measure).
    #[arg(long, conflicts_with = "connect")]
    listen: Option<String>,
    /// Measure against a peer serving on this address.
    #[arg(long)]
    connect: Option<String>,
    /// With `--connect`: also time exchanges of this many bytes each way.
    #[arg(long, value_delimiter = ',')]
    exchange_bytes: Vec<usize>,
}

/// Round trips of `bytes` each way on `(client, server)` until the budget
/// is spent; returns the sorted samples in µs.
fn measure<S: Read + Write + Send + 'static>(
    mut client: S,
    mut server: S,
    bytes: usize,
    budget: Duration,
) -> std::io::Result<Vec<f64>> {
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; bytes];
        loop {
            match server.read_exact(&mut buf) {
                Ok(()) => server.write_all(&buf)?,
                // The client is done.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let msg = vec![7u8; bytes];
    let mut back = vec![0u8; bytes];
    let mut samples = Vec::new();
    for _ in 0..200 {
        client.write_all(&msg)?;
        client.read_exact(&mut back)?;
    }
    let t_end = Instant::now() + budget;
    while Instant::now() < t_end {
        let t0 = Instant::now();
        client.write_all(&msg)?;
        client.read_exact(&mut back)?;
        samples.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    drop(client);
    echo.join()
        .map_err(|_| std::io::Error::other("echo thread panicked"))??;
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

/// A non-blocking stream whose reads and writes spin until they go
/// through.
struct Spin<S>(S);

impl<S: Read> Read for Spin<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }
}

impl<S: Write> Write for Spin<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            match self.0.write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

fn unix_pair(tag: usize) -> std::io::Result<(UnixStream, UnixStream)> {
    let name = format!("chorus-pingpong-{}-{tag}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = UnixListener::bind_addr(&addr)?;
    let c = UnixStream::connect_addr(&addr)?;
    let (s, _) = l.accept()?;
    Ok((c, s))
}

fn tcp_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    c.set_nodelay(true)?;
    s.set_nodelay(true)?;
    Ok((c, s))
}

/// What the connecting side asks of the serving one, as three u64s (little
/// endian): the mode (0: done, 1: ping-pong, 2: exchange), the bytes per
/// message and the number of repetitions.
fn ask(s: &mut TcpStream, mode: u64, bytes: usize, reps: usize) -> std::io::Result<()> {
    let mut h = [0u8; 24];
    h[..8].copy_from_slice(&mode.to_le_bytes());
    h[8..16].copy_from_slice(&(bytes as u64).to_le_bytes());
    h[16..].copy_from_slice(&(reps as u64).to_le_bytes());
    s.write_all(&h)
}

/// Writes `bytes` on a clone of `s` from another thread while reading as
/// many from `s`: one exchange, as both sides of an all_reduce step do.
fn exchange(
    s: &mut TcpStream,
    out: &std::sync::Arc<Vec<u8>>,
    back: &mut [u8],
) -> std::io::Result<()> {
    let mut w = s.try_clone()?;
    let out = out.clone();
    let writer = std::thread::spawn(move || w.write_all(&out));
    s.read_exact(back)?;
    writer
        .join()
        .map_err(|_| std::io::Error::other("writer thread panicked"))?
}

/// The serving side: does what each request says until told it is done.
fn serve(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let l = TcpListener::bind(addr)?;
    let (mut s, _) = l.accept()?;
    s.set_nodelay(true)?;
    loop {
        let mut h = [0u8; 24];
        s.read_exact(&mut h)?;
        let word =
            |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let (mode, bytes, reps) = (word(0), word(1) as usize, word(2) as usize);
        if bytes > 1 << 31 {
            return Err(format!("peer asked for {bytes}-byte messages (at most 2 GiB)").into());
        }
        let mut buf = vec![0u8; bytes];
        match mode {
            0 => return Ok(()),
            1 => {
                for _ in 0..reps {
                    s.read_exact(&mut buf)?;
                    s.write_all(&buf)?;
                }
            }
            2 => {
                let out = std::sync::Arc::new(vec![3u8; bytes]);
                for _ in 0..reps {
                    exchange(&mut s, &out, &mut buf)?;
                    // Lined up with the peer before the next one.
                    s.write_all(&[1])?;
                    s.read_exact(&mut [0u8; 1])?;
                }
            }
            m => return Err(format!("unknown request mode {m}").into()),
        }
    }
}

/// The connecting side: ping-pongs each size, then times each exchange;
/// prints a JSON line for each.
fn drive(addr: &str, a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            // The serving side may not listen yet.
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("cannot connect to {addr}: {e}").into()),
        }
    };
    s.set_nodelay(true)?;
    let print = |what: &str, bytes: usize, v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
        let gbps = if what == "exchange" {
            format!(",\"gbps_each_way\":{:.3}", bytes as f64 / (q(0.5) * 1e3))
        } else {
            String::new()
        };
        println!(
            "{{\"transport\":\"tcp-remote\",\"mode\":\"{what}\",\"bytes\":{bytes},\"median_us\":{:.2},\"p99_us\":{:.2},\"samples\":{}{gbps}}}",
            q(0.5),
            q(0.99),
            v.len()
        );
    };
    for &bytes in &a.sizes {
        let (msg, mut back) = (vec![7u8; bytes], vec![0u8; bytes]);
        // A first round to learn how many fit in the budget.
        let mut once = |s: &mut TcpStream| -> std::io::Result<f64> {
            let t = Instant::now();
            s.write_all(&msg)?;
            s.read_exact(&mut back)?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        };
        ask(&mut s, 1, bytes, 200)?;
        let mut warm: Vec<f64> = (0..200).map(|_| once(&mut s)).collect::<Result<_, _>>()?;
        warm.sort_by(f64::total_cmp);
        let reps = ((a.budget_s * 1e6 / warm[100].max(1.0)) as usize).clamp(10, 1_000_000);
        ask(&mut s, 1, bytes, reps)?;
        let mut v: Vec<f64> = (0..reps).map(|_| once(&mut s)).collect::<Result<_, _>>()?;
        print("pingpong", bytes, &mut v);
    }
    for &bytes in &a.exchange_bytes {
        let out = std::sync::Arc::new(vec![5u8; bytes]);
        let mut back = vec![0u8; bytes];
        let reps = 20;
        ask(&mut s, 2, bytes, reps + 3)?;
        let mut v = Vec::new();
        for i in 0..reps + 3 {
            let t = Instant::now();
            exchange(&mut s, &out, &mut back)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            s.read_exact(&mut [0u8; 1])?;
            s.write_all(&[1])?;
            // The first three warm up.
            if i >= 3 {
                v.push(us);
            }
        }
        print("exchange", bytes, &mut v);
    }
    ask(&mut s, 0, 0, 0)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    if let Some(addr) = &a.listen {
        return serve(addr);
    }
    if let Some(addr) = &a.connect {
        if a.sizes.contains(&0) || a.exchange_bytes.contains(&0) {
            return Err("sizes must be at least 1 byte".into());
        }
        return drive(addr, &a);
    }
    let budget = Duration::from_secs_f64(a.budget_s);
    for t in &a.transports {
        for (i, &bytes) in a.sizes.iter().enumerate() {
            if bytes == 0 {
                return Err("sizes must be at least 1 byte".into());
            }
            let s = match t.as_str() {
                "unix" => {
                    let (c, s) = unix_pair(i)?;
                    measure(c, s, bytes, budget)?
                }
                "tcp" => {
                    let (c, s) = tcp_pair()?;
                    measure(c, s, bytes, budget)?
                }
                "unix-spin" => {
                    let (c, s) = unix_pair(i)?;
                    c.set_nonblocking(true)?;
                    s.set_nonblocking(true)?;
                    measure(Spin(c), Spin(s), bytes, budget)?
                }
                other => {
                    return Err(format!("unknown transport {other} (unix, tcp, unix-spin)").into())
                }
            };
            let q = |p: f64| s[((s.len() - 1) as f64 * p) as usize];
            println!(
                "{{\"transport\":\"{t}\",\"bytes\":{bytes},\"median_us\":{:.2},\"p99_us\":{:.2},\"samples\":{}}}",
                q(0.5),
                q(0.99),
                s.len()
            );
        }
    }
    Ok(())
}
