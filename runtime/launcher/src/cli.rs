//! Command line of chorus-run and the per-rank environment it derives.

use std::ffi::OsString;
use std::net::TcpListener;
use std::time::Duration;

use clap::Parser;

use super::share_gpu::SharedGpu;

/// Starts N local ranks of PROGRAM with the torchrun environment (RANK,
/// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
/// MASTER_PORT), prefixes each output line with `[rank R] `, forwards
/// SIGINT/SIGTERM/SIGHUP (a second one kills the ranks), and stops every
/// rank when one fails.
///
/// Exit status: 0 when every rank exits 0; otherwise the code of the first
/// rank that failed (128+N if it was killed by signal N); 128+N if chorus-run
/// itself was stopped by signal N and no rank failed; 126/127 if PROGRAM
/// cannot be executed / found; 2 for a bad command line.
#[derive(Debug, Parser)]
#[command(name = "chorus-run", version)]
pub(crate) struct Args {
    /// Number of ranks to start on this node.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) nproc_per_node: u32,

    /// Number of nodes of the job (each runs one chorus-run).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) nnodes: u32,

    /// Rank of this node, in 0..K (GROUP_RANK of its ranks).
    #[arg(long, value_name = "I", default_value_t = 0)]
    pub(crate) node_rank: u32,

    /// Address of the node that runs rank 0 (hosts the store). Default
    /// 127.0.0.1 on a single node; required with --nnodes > 1.
    #[arg(long, value_name = "ADDR")]
    pub(crate) master_addr: Option<String>,

    /// Port of rank 0's store. Default on a single node: a free port picked
    /// by chorus-run; required with --nnodes > 1.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) master_port: Option<u16>,

    /// Seconds the other ranks get after SIGTERM (when a rank failed or
    /// chorus-run was interrupted) before they are killed with SIGKILL.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub(crate) kill_timeout: Duration,

    /// Let rank 0 host the job's store, as without a launcher. By default
    /// this chorus-run (node 0's, with several nodes) serves it for the
    /// whole job on --master-addr:--master-port, so that no rank's death,
    /// rank 0's included, takes the store down.
    #[arg(long)]
    pub(crate) rank0_store: bool,

    /// When a rank fails, let the others run on (instead of stopping them);
    /// exit with the first failing rank's code once every rank is done.
    /// For fault-injection tests.
    #[arg(long)]
    pub(crate) keep_going: bool,

    /// Restart a rank that fails (exits non-zero or is killed) in place, up
    /// to N times in all on this node, without touching the other ranks:
    /// the replacement gets the same RANK and LOCAL_RANK, and
    /// CHORUS_RANK_RESTARTS says how often this rank was restarted (0 for
    /// the first start). The program decides how a replacement rejoins
    /// (the survivors re-form their group; see docs/FAULTS.md). Needs the
    /// launcher's store (not with --rank0-store). Default 0: a failed rank
    /// stops the job.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) max_restarts: u32,

    /// Run every local rank on one GPU (device 0, or --gpu N), to develop
    /// and test a multi-GPU program on a machine with one GPU. Each rank
    /// sees that GPU alone (CUDA_VISIBLE_DEVICES, LOCAL_RANK=0) and claims
    /// a host of its own for NCCL (its own NCCL_HOSTID), which then joins
    /// the ranks over sockets on loopback (NCCL_SOCKET_IFNAME=lo,
    /// NCCL_IB_DISABLE=1) and time-shares the GPU between them: the
    /// results are real, the timings mean nothing about speed. CHORUS_SHARE_GPU=1
    /// tells the ranks. Single node only.
    #[arg(long)]
    pub(crate) share_gpu: bool,

    /// The GPU --share-gpu puts every rank on: an index into the inherited
    /// CUDA_VISIBLE_DEVICES if set, else a device number.
    #[arg(long, value_name = "N", requires = "share_gpu")]
    pub(crate) gpu: Option<u32>,

    /// The program to run and its arguments (after `--`).
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub(crate) command: Vec<OsString>,
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{s:?} is not a non-negative, finite number of seconds"))
}

/// What every rank of this node shares; [`Plan::rank_env`] gives one rank's
/// variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) nproc_per_node: u32,
    pub(crate) nnodes: u32,
    pub(crate) node_rank: u32,
    pub(crate) master_addr: String,
    /// 0 until node 0's chorus-run bound its store on a free port.
    pub(crate) master_port: u16,
    /// The launcher serves the store (node 0's hosts it, the others' ranks
    /// connect to it); false: rank 0 does.
    pub(crate) launcher_store: bool,
    /// Every rank on this one GPU (`--share-gpu`).
    pub(crate) shared_gpu: Option<SharedGpu>,
}

impl Plan {
    /// Checks the arguments and fills in the defaults (master address, free
    /// port on a single node).
    pub(crate) fn from_args(args: &Args) -> Result<Plan, String> {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        Plan::with_visible_devices(args, visible.as_deref())
    }

    /// [`from_args`](Self::from_args) with the inherited
    /// `CUDA_VISIBLE_DEVICES` given.
    pub(crate) fn with_visible_devices(args: &Args, visible: Option<&str>) -> Result<Plan, String> {
        if args.node_rank >= args.nnodes {
            return Err(format!(
                "--node-rank {} is not below --nnodes {}",
                args.node_rank, args.nnodes
            ));
        }
        if args.max_restarts > 0 && args.rank0_store {
            return Err(
                "--max-restarts needs the launcher's store: a restarted rank 0 would take the \
                 job's store with it under --rank0-store"
                    .into(),
            );
        }
        if u64::from(args.nnodes) * u64::from(args.nproc_per_node) > u64::from(u32::MAX) {
            return Err("--nnodes times --nproc-per-node is too large".into());
        }
        let multi = args.nnodes > 1;
        let shared_gpu = match (args.share_gpu, multi) {
            (false, _) => None,
            (true, true) => {
                return Err(
                    "--share-gpu puts the ranks of one host on one GPU, over loopback: use it \
                     with --nnodes 1"
                        .into(),
                )
            }
            (true, false) => Some(SharedGpu::new(args.gpu.unwrap_or(0), visible)?),
        };
        let master_addr = match (&args.master_addr, multi) {
            (Some(a), _) => a.clone(),
            (None, false) => "127.0.0.1".to_string(),
            (None, true) => {
                return Err("--master-addr is required with --nnodes > 1 (the address of the node with --node-rank 0)".into())
            }
        };
        let master_port = match (args.master_port, multi) {
            (Some(p), _) => p,
            // The store binds port 0 and learns its port.
            (None, false) if !args.rank0_store => 0,
            (None, false) => free_port(&master_addr)?,
            (None, true) => {
                return Err(
                    "--master-port is required with --nnodes > 1 (the same on every node)".into(),
                )
            }
        };
        Ok(Plan {
            nproc_per_node: args.nproc_per_node,
            nnodes: args.nnodes,
            node_rank: args.node_rank,
            master_addr,
            master_port,
            launcher_store: !args.rank0_store,
            shared_gpu,
        })
    }

    /// Whether this chorus-run serves the job's store.
    pub(crate) fn hosts_store(&self) -> bool {
        self.launcher_store && self.node_rank == 0
    }

    /// Where node 0's chorus-run binds the store: `master_addr` if it is
    /// an IP address (or `localhost`), every interface otherwise (a host
    /// name, which may resolve to an address of another interface), with
    /// `master_port` (0: any free port).
    pub(crate) fn store_bind_addr(&self) -> std::net::SocketAddr {
        use std::net::{IpAddr, Ipv4Addr};
        let ip = match self.master_addr.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) if self.master_addr.eq_ignore_ascii_case("localhost") => {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            }
            Err(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        std::net::SocketAddr::new(ip, self.master_port)
    }

    /// Global rank of local rank `local`.
    pub(crate) fn rank(&self, local: u32) -> u32 {
        self.node_rank * self.nproc_per_node + local
    }

    /// The environment of local rank `local` (torchrun's names), started
    /// for the `restarts`-th time after failures (0: its first start).
    pub(crate) fn rank_env(&self, local: u32, restarts: u32) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (RESTARTS_VAR, restarts.to_string()),
            ("RANK", self.rank(local).to_string()),
            (
                "WORLD_SIZE",
                (self.nnodes * self.nproc_per_node).to_string(),
            ),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            // A rank that finds this dies with this launcher (see
            // `chorus_store::rendezvous`): a SIGKILLed chorus-run leaves no
            // rank behind.
            (LAUNCHER_PID_VAR, std::process::id().to_string()),
            (
                STORE_HOST_VAR,
                if self.launcher_store {
                    "launcher"
                } else {
                    "rank0"
                }
                .to_string(),
            ),
        ];
        if let Some(gpu) = &self.shared_gpu {
            for (k, v) in gpu.rank_env(self.rank(local)) {
                match env.iter_mut().find(|(name, _)| *name == k) {
                    Some(slot) => slot.1 = v,
                    None => env.push((k, v)),
                }
            }
        }
        env
    }
}

/// Names this launcher to its ranks (`chorus_store::rendezvous::LAUNCHER_PID_VAR`,
/// which a test checks this equals).
pub(crate) const LAUNCHER_PID_VAR: &str = "CHORUS_RUN_PID";

/// How often this rank was restarted in place (`--max-restarts`).
pub(crate) const RESTARTS_VAR: &str = "CHORUS_RANK_RESTARTS";

/// Says who serves the store (`chorus_store::rendezvous::STORE_HOST_ENV`).
pub(crate) const STORE_HOST_VAR: &str = "CHORUS_STORE_HOST";

/// A port that was free on `addr` a moment ago (the OS picks it; it is
/// released again before the ranks start, so another process could take it
/// in between: pass --master-port where that matters).
fn free_port(addr: &str) -> Result<u16, String> {
    let l = TcpListener::bind((addr, 0)).map_err(|e| {
        format!("cannot find a free port on {addr} for the store: {e}; pass --master-port")
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port on {addr}: {e}; pass --master-port"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("chorus-run").chain(args.iter().copied()))
    }

    #[test]
    fn the_launcher_variables_are_the_ones_ranks_read() {
        assert_eq!(LAUNCHER_PID_VAR, chorus_store::rendezvous::LAUNCHER_PID_VAR);
        assert_eq!(STORE_HOST_VAR, chorus_store::rendezvous::STORE_HOST_ENV);
    }

    #[test]
    fn env_of_each_rank_on_node_1_of_2() {
        let a = parse(&[
            "--nproc-per-node",
            "3",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.7",
            "--master-port",
            "4242",
            "--",
            "prog",
            "--flag",
        ])
        .unwrap();
        assert_eq!(a.command, vec![OsString::from("prog"), "--flag".into()]);
        let p = Plan::from_args(&a).unwrap();
        let env = p.rank_env(2, 0);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("RANK"), "5");
        assert_eq!(get("WORLD_SIZE"), "6");
        assert_eq!(get("LOCAL_RANK"), "2");
        assert_eq!(get("LOCAL_WORLD_SIZE"), "3");
        assert_eq!(get("GROUP_RANK"), "1");
        assert_eq!(get("MASTER_ADDR"), "10.0.0.7");
        assert_eq!(get("MASTER_PORT"), "4242");
        assert_eq!(get(RESTARTS_VAR), "0");
        let again = p.rank_env(2, 3);
        assert!(again.contains(&(RESTARTS_VAR, "3".to_string())));
        assert!(again.contains(&("RANK", "5".to_string())));
    }

    #[test]
    fn single_node_defaults_pick_a_port() {
        let a = parse(&["--nproc-per-node", "2", "prog", "-x"]).unwrap();
        assert_eq!(a.command, vec![OsString::from("prog"), "-x".into()]);
        let p = Plan::from_args(&a).unwrap();
        assert_eq!(p.master_addr, "127.0.0.1");
        // chorus-run serves the store: it binds any free port itself.
        assert!(p.hosts_store());
        assert_eq!(p.master_port, 0);
        assert_eq!(p.store_bind_addr().to_string(), "127.0.0.1:0");
        // With the store on rank 0 the port is picked up front.
        let a = parse(&["--nproc-per-node", "2", "--rank0-store", "prog"]).unwrap();
        let p = Plan::from_args(&a).unwrap();
        assert!(!p.hosts_store());
        assert_ne!(p.master_port, 0);
        let env = p.rank_env(0, 0);
        assert!(env.contains(&(STORE_HOST_VAR, "rank0".to_string())));
    }

    #[test]
    fn only_node_0_serves_the_store_and_every_node_says_where_it_is() {
        let node = |i: &str| {
            let a = parse(&[
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                i,
                "--master-addr",
                "node0",
                "--master-port",
                "29500",
                "prog",
            ])
            .unwrap();
            Plan::from_args(&a).unwrap()
        };
        let (n0, n1) = (node("0"), node("1"));
        assert!(n0.hosts_store() && !n1.hosts_store());
        // A host name: every interface.
        assert_eq!(n0.store_bind_addr().to_string(), "0.0.0.0:29500");
        for p in [&n0, &n1] {
            let env = p.rank_env(1, 0);
            assert!(env.contains(&(STORE_HOST_VAR, "launcher".to_string())));
            assert!(env.contains(&("MASTER_PORT", "29500".to_string())));
        }
    }

    #[test]
    fn share_gpu_puts_every_local_rank_on_one_gpu_with_its_own_host() {
        let a = parse(&["--nproc-per-node", "3", "--share-gpu", "prog"]).unwrap();
        let p = Plan::with_visible_devices(&a, None).unwrap();
        let envs: Vec<_> = (0..3).map(|l| p.rank_env(l, 0)).collect();
        let get = |env: &[(&'static str, String)], k: &str| {
            let hits: Vec<_> = env.iter().filter(|(n, _)| *n == k).collect();
            assert_eq!(hits.len(), 1, "{k} set {} times", hits.len());
            hits[0].1.clone()
        };
        for (l, env) in envs.iter().enumerate() {
            assert_eq!(get(env, "RANK"), l.to_string());
            assert_eq!(get(env, "LOCAL_RANK"), "0");
            assert_eq!(get(env, "LOCAL_WORLD_SIZE"), "3");
            assert_eq!(get(env, "CUDA_VISIBLE_DEVICES"), "0");
            assert_eq!(get(env, "NCCL_SOCKET_IFNAME"), "lo");
        }
        let hosts: std::collections::BTreeSet<String> =
            envs.iter().map(|e| get(e, "NCCL_HOSTID")).collect();
        assert_eq!(hosts.len(), 3);
        // A replacement claims the same host as the rank it replaces.
        assert_eq!(
            get(&p.rank_env(1, 2), "NCCL_HOSTID"),
            get(&envs[1], "NCCL_HOSTID")
        );

        let a = parse(&["--nproc-per-node", "2", "--share-gpu", "--gpu", "1", "prog"]).unwrap();
        let p = Plan::with_visible_devices(&a, Some("6,7")).unwrap();
        assert!(p
            .rank_env(0, 0)
            .contains(&("CUDA_VISIBLE_DEVICES", "7".to_string())));
        assert!(Plan::with_visible_devices(&a, Some("6"))
            .unwrap_err()
            .contains("--gpu 1"));

        // Without the flag nothing changes.
        let a = parse(&["--nproc-per-node", "2", "prog"]).unwrap();
        let p = Plan::with_visible_devices(&a, None).unwrap();
        assert!(p.shared_gpu.is_none());
        assert!(!p.rank_env(1, 0).iter().any(|(k, _)| *k == "NCCL_HOSTID"));
        assert!(p.rank_env(1, 0).contains(&("LOCAL_RANK", "1".to_string())));
    }

    #[test]
    fn share_gpu_is_refused_where_it_cannot_work() {
        // --gpu needs --share-gpu.
        assert!(parse(&["--nproc-per-node", "2", "--gpu", "1", "prog"]).is_err());
        let a = parse(&[
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--master-addr",
            "n0",
            "--master-port",
            "29500",
            "--share-gpu",
            "prog",
        ])
        .unwrap();
        assert!(Plan::with_visible_devices(&a, None)
            .unwrap_err()
            .contains("--nnodes 1"));
    }

    #[test]
    fn bad_command_lines_are_refused() {
        assert!(parse(&["--nproc-per-node", "0", "--", "prog"]).is_err());
        assert!(parse(&["--nproc-per-node", "2"]).is_err());
        assert!(parse(&["--nproc-per-node", "2", "--kill-timeout", "-1", "prog"]).is_err());
        let a = parse(&[
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "p",
        ])
        .unwrap();
        assert!(Plan::from_args(&a).unwrap_err().contains("--node-rank 2"));
        let a = parse(&["--nproc-per-node", "2", "--nnodes", "2", "p"]).unwrap();
        assert!(Plan::from_args(&a).unwrap_err().contains("--master-addr"));
        let a = parse(&[
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--rank0-store",
            "p",
        ])
        .unwrap();
        assert!(Plan::from_args(&a).unwrap_err().contains("--max-restarts"));
    }
}
