//! Test hosts on one machine: network namespaces joined by a switch, for
//! tests of what crosses a network (TCP between hosts, partitions).
//!
//! [`Hosts::new`] makes K host namespaces and one switch namespace holding
//! a bridge; each host has one veth link (`eth0`, address
//! `10.77.0.{i+1}/24`) to the switch, and an `/etc/hosts` of its own
//! (`ip netns exec` mounts `/etc/netns/NAME/hosts`) naming every host
//! `nodeI`. Every device lives inside the namespaces, none in the
//! machine's own, so deleting the namespaces removes everything.
//! [`Hosts::spawn`] runs a program inside a host; [`Hosts::cut`] takes a
//! host's link down at the switch (packets are dropped without an error on
//! either side: a partition). Dropping the value kills every process in the
//! namespaces and removes them; [`leftovers`] tells whether anything of a
//! harness is still there, and [`outputs`] gathers every node's output for
//! a failure's message.
//!
//! Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`;
//! [`Hosts::new`] says which is missing.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every harness's namespaces start with this (and the process id).
const PREFIX: &str = "chorus-t";

/// K test hosts (see the module docs).
#[derive(Debug)]
pub struct Hosts {
    tag: String,
    k: usize,
    children: Vec<Child>,
}

/// The output of a process started with [`Hosts::spawn`], line by line as
/// it arrives, with the instant each line came.
#[derive(Clone, Debug, Default)]
pub struct Output(Arc<Mutex<Vec<(Instant, String)>>>);

impl Output {
    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// The lines so far, one string.
    pub fn text(&self) -> String {
        self.lines().join("\n")
    }

    /// Waits up to `timeout` for a line containing `needle`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.lines().iter().any(|l| l.contains(needle)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// Every node's output, numbered, for a failure's message (`nodes` as
/// [`Hosts::spawn`]'s results, in node order).
pub fn outputs(nodes: &[(usize, Output)]) -> String {
    nodes
        .iter()
        .enumerate()
        .map(|(i, (_, o))| format!("--- node {i}\n{}", o.text()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Namespaces of any harness still present (all of them when
/// `this_process_only` is false, else this process's).
pub fn leftovers(this_process_only: bool) -> Vec<String> {
    let mine = format!("{PREFIX}{}-", std::process::id());
    let out = Command::new("ip").args(["netns", "list"]).output();
    let Ok(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| {
            if this_process_only {
                n.starts_with(&mine)
            } else {
                n.starts_with(PREFIX)
            }
        })
        .map(str::to_owned)
        .collect()
}

impl Hosts {
    /// Makes `k` hosts (2 to 8) joined by a switch.
    ///
    /// # Errors
    ///
    /// What stopped it, e.g. not root, or no `ip`; what was made so far is
    /// removed.
    pub fn new(k: usize) -> Result<Hosts, String> {
        if !(2..=8).contains(&k) {
            return Err(format!("{k} hosts: between 2 and 8"));
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let hosts = Hosts {
            tag,
            k,
            children: Vec::new(),
        };
        hosts.build().map_err(|e| {
            format!(
                "cannot make {k} test hosts in network namespaces: {e} (this needs root, or \
                 CAP_SYS_ADMIN and CAP_NET_ADMIN, and iproute2)"
            )
        })?;
        Ok(hosts)
    }

    fn build(&self) -> Result<(), String> {
        let sw = self.switch();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        let mut hosts_file = String::from("127.0.0.1 localhost\n");
        for i in 0..self.k {
            hosts_file.push_str(&format!("{} node{i}\n", self.addr(i)));
        }
        for i in 0..self.k {
            let h = self.name(i);
            ip(&["netns", "add", &h])?;
            let port = format!("p{i}");
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &h,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            let cidr = format!("{}/24", self.addr(i));
            ip(&["-n", &h, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &h, "link", "set", "eth0", "up"])?;
            ip(&["-n", &h, "link", "set", "lo", "up"])?;
            let dir = format!("/etc/netns/{h}");
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(format!("{dir}/hosts"), &hosts_file))
                .map_err(|e| format!("cannot write {dir}/hosts: {e}"))?;
        }
        Ok(())
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.tag)
    }

    /// Host `i`'s namespace.
    pub fn name(&self, i: usize) -> String {
        format!("{}-h{i}", self.tag)
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, i as u8 + 1)
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.k
    }

    /// Always false (a harness has 2 hosts or more).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Runs `program args` in host `i` with `env`; its stdout and stderr
    /// are collected into the returned [`Output`]. The process is killed
    /// with the harness.
    ///
    /// # Errors
    ///
    /// The process could not be started.
    pub fn spawn(
        &mut self,
        i: usize,
        program: &std::path::Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<(usize, Output), String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name(i)])
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start {} in {}: {e}",
                program.display(),
                self.name(i)
            )
        })?;
        let out = Output::default();
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let sink = out.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    sink.0
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), line));
                }
            });
        }
        self.children.push(child);
        Ok((self.children.len() - 1, out))
    }

    /// Waits up to `timeout` for the process `id` (from [`spawn`](Self::spawn))
    /// to exit; its exit status, or `None` if it still runs.
    pub fn wait(&mut self, id: usize, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        let child = self.children.get_mut(id)?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if t0.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The process id of `id`'s process (the program's: `ip netns exec`
    /// execs it).
    pub fn pid(&self, id: usize) -> Option<u32> {
        self.children.get(id).map(Child::id)
    }

    /// Takes host `i`'s link down at the switch: its packets are dropped
    /// from now on, with no error on either side (a partition).
    ///
    /// # Errors
    ///
    /// The `ip` command failed.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&[
            "-n",
            &self.switch(),
            "link",
            "set",
            &format!("p{i}"),
            "down",
        ])
    }

    /// Processes still running in host `i`'s namespace.
    pub fn pids_in(&self, i: usize) -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", &self.name(i)])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, killpg, Signal};
        use nix::unistd::Pid;
        for c in &mut self.children {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
        }
        for i in 0..self.k {
            for p in self.pids_in(i) {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        for i in 0..self.k {
            let t0 = Instant::now();
            while !self.pids_in(i).is_empty() && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = ip(&["netns", "del", &self.name(i)]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name(i)));
        }
        let _ = ip(&["netns", "del", &self.switch()]);
    }
}
