//! Who serves the store: chorus's `TcpStoreServer` in the parent, or
//! PyTorch's TCPStore in a Python process the parent starts.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chorus::store::{ServerOptions, ServerStats, TcpStoreServer};

/// PyTorch's TCPStore on its libuv server, port printed on stdout.
const TORCH_SERVER: &str = "import sys, time, torch.distributed as d\n\
s = d.TCPStore('127.0.0.1', 0, is_master=True, use_libuv=True, wait_for_workers=False, \
timeout=__import__('datetime').timedelta(seconds=600))\n\
print(s.port, flush=True)\n\
sys.stdin.read()\n";

pub(crate) enum Host {
    Chorus(TcpStoreServer),
    Torch(Child),
}

impl Host {
    /// Starts the server; its address.
    pub(crate) async fn start(torch: Option<&str>) -> Result<(Host, String), String> {
        match torch {
            None => {
                let s = TcpStoreServer::bind(
                    "127.0.0.1:0".parse().expect("address"),
                    ServerOptions::default(),
                )
                .await
                .map_err(|e| format!("store server: {e}"))?;
                let addr = s.local_addr().to_string();
                Ok((Host::Chorus(s), addr))
            }
            Some(python) => {
                let mut c = Command::new(python)
                    .args(["-c", TORCH_SERVER])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("{python}: {e}"))?;
                let out = c.stdout.take().ok_or("no stdout")?;
                let mut line = String::new();
                BufReader::new(out)
                    .read_line(&mut line)
                    .map_err(|e| format!("TCPStore's port: {e}"))?;
                let port: u16 = line
                    .trim()
                    .parse()
                    .map_err(|_| format!("TCPStore printed {line:?}, not its port"))?;
                Ok((Host::Torch(c), format!("127.0.0.1:{port}")))
            }
        }
    }

    /// The server's counters (PyTorch's: unknown, zero).
    pub(crate) fn stats(&self) -> ServerStats {
        match self {
            Host::Chorus(s) => s.stats(),
            Host::Torch(_) => ServerStats::default(),
        }
    }

    /// CPU time of the process that serves the store.
    pub(crate) fn cpu(&self) -> Duration {
        match self {
            Host::Chorus(_) => {
                use nix::sys::resource::{getrusage, UsageWho};
                getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
                    let us = |t: nix::sys::time::TimeVal| {
                        t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64
                    };
                    Duration::from_micros(us(u.user_time()) + us(u.system_time()))
                })
            }
            Host::Torch(c) => {
                // utime and stime, fields 14 and 15 of /proc/PID/stat, in
                // clock ticks (100 a second on Linux).
                let stat =
                    std::fs::read_to_string(format!("/proc/{}/stat", c.id())).unwrap_or_default();
                let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
                let f: Vec<i64> = after
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                // After the name: the state (not a number), then ppid,
                // pgrp, session, tty, tpgid, flags, four fault counts,
                // utime and stime.
                let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
                let ticks = u64::try_from(ticks).unwrap_or(0);
                Duration::from_millis(ticks * 10)
            }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Host::Torch(c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
