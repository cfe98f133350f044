//! The machine's floor for a small exchange: a blocking ping-pong of the
//! same bytes over the transports the TCP backend and the store use (an
//! abstract Unix socket, loopback TCP with `TCP_NODELAY`), one thread per
//! side, no runtime. The comparisons (`tcp_vs_gloo.py`, `store.sh`) run it
//! beside chorus in the same call, so each figure is read against the floor
//! as the machine is at that moment.
//!
//! Prints one JSON line per transport and size: round-trip median and p99
//! in µs.
//!
//! `pingpong [--transports unix,tcp] [--sizes 4,65536] [--budget-s 1]`
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
    /// Transports: unix (abstract Unix socket), tcp (loopback).
    #[arg(long, value_delimiter = ',', default_value = "unix,tcp")]
    transports: Vec<String>,
    /// Message sizes in bytes (each way).
    #[arg(long, value_delimiter = ',', default_value = "4,65536")]
    sizes: Vec<usize>,
    /// Seconds of timed round trips per transport and size.
    #[arg(long, default_value_t = 1.0)]
    budget_s: f64,
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
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
                other => return Err(format!("unknown transport {other} (unix, tcp)").into()),
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
