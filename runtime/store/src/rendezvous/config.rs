//! Where a rank is and where the store is: [`RendezvousConfig`], from the
//! environment (torchrun, SLURM, Open MPI) or from a builder.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::config::{AGENT_STORE_ENV, RENDEZVOUS_TIMEOUT_ENV, TOKEN_ENV};

/// Default time [`rendezvous`](super::rendezvous) waits for every rank to
/// join (`CHORUS_RENDEZVOUS_TIMEOUT` or [`RendezvousConfigBuilder::timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Default time rank 0's [`shutdown`](super::Rendezvous::shutdown) waits for
/// the other ranks to leave before it stops the store server anyway.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Which launcher convention a [`RendezvousConfig`] was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (torchrun, chorus-run).
    Torchrun,
    /// SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ... (srun).
    Slurm,
    /// OMPI_COMM_WORLD_RANK, ... (Open MPI's mpirun).
    OpenMpi,
    /// [`RendezvousConfig::builder`].
    Builder,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Torchrun => "torchrun variables",
            Source::Slurm => "SLURM variables",
            Source::OpenMpi => "Open MPI variables",
            Source::Builder => "builder",
        })
    }
}

/// Where the job's store is served.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreHost {
    /// Rank 0 serves a chorus store on [`RendezvousConfig::bind_addr`];
    /// every rank connects to `master_addr:master_port`. The default.
    Rank0,
    /// A PyTorch TCPStore already serves on `master_addr:master_port`
    /// (torchrun's elastic agent, which says so with
    /// `TORCHELASTIC_USE_AGENT_STORE=True`): no rank binds the port, every
    /// rank connects a [`TorchStore`](crate::TorchStore), and chorus's keys
    /// live under `namespace`, so that each restart of the workers starts
    /// from a clean slate in the agent's long-lived store.
    Torch {
        /// The prefix of every key chorus sets there.
        namespace: String,
    },
    /// The launcher serves a chorus store on `master_addr:master_port` for
    /// the job's whole life (`chorus-run` on node 0, which says so with
    /// `CHORUS_STORE_HOST=launcher`): no rank binds the port, every rank
    /// connects, and no rank's death — rank 0's included — takes the store
    /// down.
    Launcher,
}

/// The variable with which a launcher says it serves the job's store
/// (value `launcher`, [`StoreHost::Launcher`]).
pub const STORE_HOST_ENV: &str = "CHORUS_STORE_HOST";

impl StoreHost {
    /// The namespace torchrun's workers use: `chorus/{run_id}/{restart}`
    /// from `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT`.
    pub fn torchelastic(run_id: &str, restart_count: u64) -> StoreHost {
        StoreHost::Torch {
            namespace: format!("chorus/{run_id}/{restart_count}"),
        }
    }
}

/// An environment variable that is missing, malformed or inconsistent.
///
/// `Debug` shows the message; `{:#?}` the structure.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// None of the launcher conventions is present.
    #[error("no rank in the environment: none of RANK (torchrun, chorus-run), SLURM_PROCID (srun) or OMPI_COMM_WORLD_RANK (mpirun) is set; start the program with chorus-run, torchrun --no-python, srun or mpirun, or use RendezvousConfig::builder()")]
    NoLauncher,
    /// A variable the convention needs is not set.
    #[error("{var} is not set: expected {expected}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// Its expected form and where it usually comes from.
        expected: &'static str,
    },
    /// A variable's value does not have the expected form.
    #[error("{var}={value:?} is not {expected}")]
    Malformed {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The expected form.
        expected: &'static str,
    },
    /// A variable is not below the variable that bounds it.
    #[error("{var}={value} is not below {bound_var}={bound}")]
    OutOfRange {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: usize,
        /// The variable that bounds it.
        bound_var: &'static str,
        /// The bound.
        bound: usize,
    },
    /// A variable is larger than the variable that bounds it.
    #[error("{var}={value} is larger than {bound_var}={bound}")]
    Exceeds {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: usize,
        /// The variable that bounds it.
        bound_var: &'static str,
        /// The bound.
        bound: usize,
    },
}

chorus_core::debug_shows_message!(EnvError {
    NoLauncher,
    Missing { var, expected },
    Malformed { var, value, expected },
    OutOfRange { var, value, bound_var, bound },
    Exceeds { var, value, bound_var, bound },
});

/// A [`RendezvousConfigBuilder`] that cannot build a valid config.
///
/// `Debug` shows the message; `{:#?}` the structure.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required field was not given.
    #[error("rendezvous config: {0} is not set; call RendezvousConfigBuilder::{0}(..)")]
    Missing(&'static str),
    /// A field is not below the field that bounds it.
    #[error("rendezvous config: {field} {value} is not below {bound_field} {bound}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The field that bounds it.
        bound_field: &'static str,
        /// The bound.
        bound: usize,
    },
    /// Any other invalid value, described.
    #[error("rendezvous config: {0}")]
    Invalid(String),
}

chorus_core::debug_shows_message!(ConfigError {
    Missing(field),
    OutOfRange { field, value, bound_field, bound },
    Invalid(msg),
});

/// Everything a rank needs to join the job: who it is, how many there are,
/// where rank 0's store is, and how long to wait.
///
/// Build it with [`RendezvousConfig::from_env`] or
/// [`RendezvousConfig::builder`].
#[derive(Clone, PartialEq, Eq)]
pub struct RendezvousConfig {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    master_addr: String,
    master_port: u16,
    bind_addr: Option<SocketAddr>,
    timeout: Duration,
    shutdown_timeout: Duration,
    token: Option<String>,
    source: Source,
    store_host: StoreHost,
}

impl fmt::Debug for RendezvousConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RendezvousConfig")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("bind_addr", &self.bind_addr)
            .field("timeout", &self.timeout)
            .field("shutdown_timeout", &self.shutdown_timeout)
            // Never print the secret.
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("source", &self.source)
            .field("store_host", &self.store_host)
            .finish()
    }
}

/// Form names used in error messages.
const NON_NEG: &str = "a non-negative integer";
const POSITIVE: &str = "a positive integer";

impl RendezvousConfig {
    /// A builder with no rank, world size or master set.
    pub fn builder() -> RendezvousConfigBuilder {
        RendezvousConfigBuilder::default()
    }

    /// Reads the process environment; see [`RendezvousConfig::from_lookup`].
    ///
    /// # Errors
    ///
    /// [`EnvError`] naming the variable that is missing or malformed.
    pub fn from_env() -> Result<RendezvousConfig, EnvError> {
        RendezvousConfig::from_lookup(|k| {
            std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
        })
    }

    /// Reads the launcher variables through `get` (a variable name to its
    /// value), without touching the process environment.
    ///
    /// The first convention present wins:
    ///
    /// 1. torchrun / chorus-run: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    ///    `LOCAL_WORLD_SIZE`, all required once `RANK` is set.
    /// 2. SLURM (srun): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, and
    ///    the tasks on this node from `SLURM_NTASKS_PER_NODE`, else this
    ///    node's (`SLURM_NODEID`) entry of `SLURM_TASKS_PER_NODE` (`2(x3),1`).
    /// 3. Open MPI: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
    ///    `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`.
    ///
    /// Under every convention the store's address comes from `MASTER_ADDR`
    /// (host name or IP of rank 0's node) and `MASTER_PORT` (1..=65535).
    /// chorus does not guess them from SLURM_NODELIST: under srun or mpirun,
    /// export them yourself, e.g.
    /// `export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)`
    /// and a port free on that node. Only a job of one rank may leave them
    /// unset (the store then listens on 127.0.0.1, on a port the OS picks).
    ///
    /// Under torchrun, `TORCHELASTIC_USE_AGENT_STORE=True` says the elastic
    /// agent already serves a PyTorch TCPStore on `MASTER_ADDR:MASTER_PORT`:
    /// the config then says [`StoreHost::Torch`], namespaced by
    /// `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT`
    /// ([`StoreHost::torchelastic`]), and no rank binds the port.
    ///
    /// Optional: `CHORUS_RENDEZVOUS_TIMEOUT` (seconds, default
    /// [`DEFAULT_TIMEOUT`]) and `CHORUS_STORE_TOKEN` (shared secret every
    /// rank must present to chorus's store; PyTorch's store has no
    /// authentication, so under the agent store it is not used).
    ///
    /// # Errors
    ///
    /// [`EnvError`] naming the first variable that is missing, malformed or
    /// out of range, and the form it should have.
    pub fn from_lookup<F>(get: F) -> Result<RendezvousConfig, EnvError>
    where
        F: Fn(&str) -> Option<String>,
    {
        let env = Env(&get);
        let (source, [rank, world_size, local_rank, local_world_size]) = if get("RANK").is_some() {
            (Source::Torchrun, env.ranks(TORCHRUN)?)
        } else if get("SLURM_PROCID").is_some() {
            (Source::Slurm, env.slurm()?)
        } else if get("OMPI_COMM_WORLD_RANK").is_some() {
            (Source::OpenMpi, env.ranks(OPEN_MPI)?)
        } else {
            return Err(EnvError::NoLauncher);
        };

        let store_host = if get(AGENT_STORE_ENV).as_deref() == Some("True") {
            let restart = match get("TORCHELASTIC_RESTART_COUNT") {
                None => 0,
                Some(v) => v.trim().parse::<u64>().map_err(|_| EnvError::Malformed {
                    var: "TORCHELASTIC_RESTART_COUNT",
                    value: v,
                    expected: NON_NEG,
                })?,
            };
            let run_id = get("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "none".into());
            if run_id.contains(char::is_whitespace) {
                return Err(EnvError::Malformed {
                    var: "TORCHELASTIC_RUN_ID",
                    value: run_id,
                    expected: "a run id without whitespace",
                });
            }
            StoreHost::torchelastic(&run_id, restart)
        } else {
            match get(STORE_HOST_ENV).as_deref().map(str::trim) {
                None | Some("") | Some("rank0") => StoreHost::Rank0,
                Some("launcher") => StoreHost::Launcher,
                Some(other) => {
                    return Err(EnvError::Malformed {
                        var: STORE_HOST_ENV,
                        value: other.to_string(),
                        expected: "launcher or rank0",
                    })
                }
            }
        };
        let hosted = store_host == StoreHost::Rank0;

        let (master_addr, master_port) = match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (None, None) if world_size == 1 && hosted => ("127.0.0.1".to_string(), 0),
            (addr, port) => {
                let addr = addr.ok_or(EnvError::Missing {
                    var: "MASTER_ADDR",
                    expected: "the host name or IP address of rank 0's node (torchrun and chorus-run set it; under srun or mpirun export it)",
                })?;
                if addr.is_empty() || addr.contains(char::is_whitespace) {
                    return Err(EnvError::Malformed {
                        var: "MASTER_ADDR",
                        value: addr,
                        expected: "a host name or IP address",
                    });
                }
                let port = port.ok_or(EnvError::Missing {
                    var: "MASTER_PORT",
                    expected: "a TCP port in 1..=65535, free on rank 0's node (torchrun and chorus-run set it; under srun or mpirun export it)",
                })?;
                let port = match port.trim().parse::<u16>() {
                    Ok(p) if p > 0 || (world_size == 1 && hosted) => p,
                    _ => {
                        return Err(EnvError::Malformed {
                            var: "MASTER_PORT",
                            value: port,
                            expected: "a TCP port in 1..=65535",
                        })
                    }
                };
                (addr, port)
            }
        };

        let timeout = match get(RENDEZVOUS_TIMEOUT_ENV) {
            None => DEFAULT_TIMEOUT,
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or(EnvError::Malformed {
                    var: RENDEZVOUS_TIMEOUT_ENV,
                    value: v,
                    expected: "a positive number of seconds",
                })?,
        };
        let token = match get(TOKEN_ENV) {
            Some(t) if t.is_empty() => {
                return Err(EnvError::Malformed {
                    var: TOKEN_ENV,
                    value: t,
                    expected: "a non-empty shared secret (unset it to run without one)",
                })
            }
            t => t,
        };

        Ok(RendezvousConfig {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            bind_addr: None,
            timeout,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            token,
            source,
            store_host,
        })
    }

    /// This rank, in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the job.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This rank's index on its node, in `0..local_world_size`.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Number of ranks on this rank's node.
    pub fn local_world_size(&self) -> usize {
        self.local_world_size
    }

    /// Host name or IP of rank 0's node.
    pub fn master_addr(&self) -> &str {
        &self.master_addr
    }

    /// Port of the store on rank 0's node (0: any free port, only for a job
    /// of one rank).
    pub fn master_port(&self) -> u16 {
        self.master_port
    }

    /// The address rank 0's store server binds to.
    ///
    /// Unless set with [`RendezvousConfigBuilder::bind_addr`]: the master
    /// address itself when it is an IP address (127.0.0.1 for `localhost`),
    /// so a loopback master stays private to the node; for any other host
    /// name, every interface (`0.0.0.0`), like PyTorch's TCPStore, because a
    /// host name can resolve to a different address on rank 0's node than
    /// on the others. The store has no encryption: keep the port inside the
    /// cluster network.
    pub fn bind_addr(&self) -> SocketAddr {
        if let Some(a) = self.bind_addr {
            return a;
        }
        let ip = match self.master_addr.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) if self.master_addr.eq_ignore_ascii_case("localhost") => {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            }
            Err(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        SocketAddr::new(ip, self.master_port)
    }

    /// How long [`rendezvous`](super::rendezvous) waits for every rank.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long rank 0's [`shutdown`](super::Rendezvous::shutdown) waits for
    /// the others to leave.
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }

    /// The store token, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Where this config came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Where the job's store is served.
    pub fn store_host(&self) -> &StoreHost {
        &self.store_host
    }

    /// `master_addr:master_port`, with brackets around an IPv6 address.
    pub(crate) fn master_endpoint(&self, port: u16) -> String {
        if self.master_addr.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{}]:{port}", self.master_addr)
        } else {
            format!("{}:{port}", self.master_addr)
        }
    }
}

/// Builds a [`RendezvousConfig`] without the environment.
///
/// Required: [`rank`](Self::rank), [`world_size`](Self::world_size), and,
/// when the world has more than one rank, [`master_addr`](Self::master_addr)
/// and [`master_port`](Self::master_port). `local_rank` and
/// `local_world_size` default to `rank` and `world_size` (all ranks on one
/// node).
#[derive(Clone, Debug, Default)]
pub struct RendezvousConfigBuilder {
    rank: Option<usize>,
    world_size: Option<usize>,
    local_rank: Option<usize>,
    local_world_size: Option<usize>,
    master_addr: Option<String>,
    master_port: Option<u16>,
    bind_addr: Option<SocketAddr>,
    timeout: Option<Duration>,
    shutdown_timeout: Option<Duration>,
    token: Option<String>,
    torch_namespace: Option<String>,
    launcher_store: bool,
}

impl RendezvousConfigBuilder {
    /// This rank, in `0..world_size`.
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = Some(rank);
        self
    }

    /// Number of ranks in the job (at least 1).
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.world_size = Some(world_size);
        self
    }

    /// This rank's index on its node (default: `rank`).
    pub fn local_rank(mut self, local_rank: usize) -> Self {
        self.local_rank = Some(local_rank);
        self
    }

    /// Number of ranks on this node (default: `world_size`).
    pub fn local_world_size(mut self, local_world_size: usize) -> Self {
        self.local_world_size = Some(local_world_size);
        self
    }

    /// Host name or IP of rank 0's node (default for one rank: 127.0.0.1).
    pub fn master_addr(mut self, addr: impl Into<String>) -> Self {
        self.master_addr = Some(addr.into());
        self
    }

    /// Port of rank 0's store (default for one rank: 0, any free port).
    pub fn master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }

    /// Address rank 0's store server binds to; see
    /// [`RendezvousConfig::bind_addr`] for the default.
    pub fn bind_addr(mut self, addr: SocketAddr) -> Self {
        self.bind_addr = Some(addr);
        self
    }

    /// How long to wait for every rank to join (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long rank 0 waits for the others to leave at shutdown (default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`]).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = Some(timeout);
        self
    }

    /// Shared secret every rank presents to the store.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Use the PyTorch TCPStore already serving on
    /// `master_addr:master_port` instead of hosting a store on rank 0
    /// ([`StoreHost::Torch`]); chorus's keys go under `namespace`.
    pub fn torch_store(mut self, namespace: impl Into<String>) -> Self {
        self.torch_namespace = Some(namespace.into());
        self
    }

    /// Use the chorus store a launcher already serves on
    /// `master_addr:master_port` instead of hosting one on rank 0
    /// ([`StoreHost::Launcher`]).
    pub fn launcher_store(mut self) -> Self {
        self.launcher_store = true;
        self
    }

    /// Checks the fields and builds the config.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field that is missing or out of range.
    pub fn build(self) -> Result<RendezvousConfig, ConfigError> {
        let rank = self.rank.ok_or(ConfigError::Missing("rank"))?;
        let world_size = self.world_size.ok_or(ConfigError::Missing("world_size"))?;
        if world_size == 0 {
            return Err(ConfigError::Invalid(
                "world_size is 0; it must be at least 1".into(),
            ));
        }
        below("rank", rank, "world_size", world_size)?;
        let local_rank = self.local_rank.unwrap_or(rank);
        let local_world_size = self.local_world_size.unwrap_or(world_size);
        below(
            "local_rank",
            local_rank,
            "local_world_size",
            local_world_size,
        )?;
        if local_world_size > world_size {
            return Err(ConfigError::Invalid(format!(
                "local_world_size {local_world_size} is larger than world_size {world_size}"
            )));
        }
        let store_host = match (self.torch_namespace, self.launcher_store) {
            (Some(namespace), _) => StoreHost::Torch { namespace },
            (None, true) => StoreHost::Launcher,
            (None, false) => StoreHost::Rank0,
        };
        // Only a store rank 0 hosts can take any port and be found anyway.
        let single = world_size == 1 && store_host == StoreHost::Rank0;
        let master_addr = match self.master_addr {
            Some(a) if a.is_empty() || a.contains(char::is_whitespace) => {
                return Err(ConfigError::Invalid(format!(
                    "master_addr {a:?} is not a host name or IP address"
                )))
            }
            Some(a) => a,
            None if single => "127.0.0.1".to_string(),
            None => return Err(ConfigError::Missing("master_addr")),
        };
        let master_port = match self.master_port {
            Some(0) if store_host != StoreHost::Rank0 => {
                return Err(ConfigError::Invalid(
                    "master_port 0 names no store that is already serving; give the port it serves on".into(),
                ))
            }
            Some(0) if !single => {
                return Err(ConfigError::Invalid(
                    "master_port 0 (any free port) only works for a world of one rank: the other ranks could not know the port".into(),
                ))
            }
            Some(p) => p,
            None if single => 0,
            None => return Err(ConfigError::Missing("master_port")),
        };
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(ConfigError::Invalid("timeout is zero".into()));
        }
        if matches!(&self.token, Some(t) if t.is_empty()) {
            return Err(ConfigError::Invalid(
                "token is empty; leave it unset to run without one".into(),
            ));
        }
        if matches!(&store_host, StoreHost::Torch { namespace } if namespace.is_empty()) {
            return Err(ConfigError::Invalid(
                "torch_store namespace is empty; chorus's keys need a prefix of their own in a shared store".into(),
            ));
        }
        Ok(RendezvousConfig {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            bind_addr: self.bind_addr,
            timeout,
            shutdown_timeout: self.shutdown_timeout.unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT),
            token: self.token,
            source: Source::Builder,
            store_host,
        })
    }
}

fn below(
    field: &'static str,
    value: usize,
    bound_field: &'static str,
    bound: usize,
) -> Result<(), ConfigError> {
    if value < bound {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value,
            bound_field,
            bound,
        })
    }
}

/// The four variables of a convention: rank, world size, local rank, local
/// world size, each with the hint shown when it is missing.
type Names = [(&'static str, &'static str); 4];

const TORCHRUN: Names = [
    (
        "RANK",
        "a non-negative integer, this process's rank (torchrun and chorus-run set it)",
    ),
    (
        "WORLD_SIZE",
        "a positive integer, the number of ranks (torchrun and chorus-run set it)",
    ),
    (
        "LOCAL_RANK",
        "a non-negative integer, this rank's index on its node (torchrun and chorus-run set it)",
    ),
    (
        "LOCAL_WORLD_SIZE",
        "a positive integer, the number of ranks on this node (torchrun and chorus-run set it)",
    ),
];

const OPEN_MPI: Names = [
    (
        "OMPI_COMM_WORLD_RANK",
        "a non-negative integer (mpirun sets it)",
    ),
    (
        "OMPI_COMM_WORLD_SIZE",
        "a positive integer (mpirun sets it)",
    ),
    (
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "a non-negative integer (mpirun sets it)",
    ),
    (
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "a positive integer (mpirun sets it)",
    ),
];

/// The lookup, with typed getters whose errors name the variable.
struct Env<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    fn raw(&self, var: &'static str, expected: &'static str) -> Result<String, EnvError> {
        (self.0)(var).ok_or(EnvError::Missing { var, expected })
    }

    fn parse(&self, var: &'static str, value: String, min: usize) -> Result<usize, EnvError> {
        match value.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(EnvError::Malformed {
                var,
                value,
                expected: if min == 0 { NON_NEG } else { POSITIVE },
            }),
        }
    }

    fn num(
        &self,
        (var, expected): (&'static str, &'static str),
        min: usize,
    ) -> Result<usize, EnvError> {
        let v = self.raw(var, expected)?;
        self.parse(var, v, min)
    }

    /// Rank, world size, local rank, local world size of a convention with
    /// four plain variables.
    fn ranks(&self, names: Names) -> Result<[usize; 4], EnvError> {
        let rank = self.num(names[0], 0)?;
        let world = self.num(names[1], 1)?;
        check_below(names[0].0, rank, names[1].0, world)?;
        let local = self.num(names[2], 0)?;
        let local_world = self.num(names[3], 1)?;
        check_below(names[2].0, local, names[3].0, local_world)?;
        if local_world > world {
            return Err(EnvError::Exceeds {
                var: names[3].0,
                value: local_world,
                bound_var: names[1].0,
                bound: world,
            });
        }
        Ok([rank, world, local, local_world])
    }

    fn slurm(&self) -> Result<[usize; 4], EnvError> {
        let rank = self.num(("SLURM_PROCID", "a non-negative integer (srun sets it)"), 0)?;
        let world = self.num(
            (
                "SLURM_NTASKS",
                "a positive integer (srun sets it; pass --ntasks)",
            ),
            1,
        )?;
        check_below("SLURM_PROCID", rank, "SLURM_NTASKS", world)?;
        let local = self.num(
            ("SLURM_LOCALID", "a non-negative integer (srun sets it)"),
            0,
        )?;
        let (local_var, local_world) = match (self.0)("SLURM_NTASKS_PER_NODE") {
            Some(v) => (
                "SLURM_NTASKS_PER_NODE",
                self.parse("SLURM_NTASKS_PER_NODE", v, 1)?,
            ),
            None => ("SLURM_TASKS_PER_NODE", self.slurm_tasks_per_node()?),
        };
        check_below("SLURM_LOCALID", local, local_var, local_world)?;
        Ok([rank, world, local, local_world])
    }

    /// This node's entry of SLURM_TASKS_PER_NODE (`2(x3),1`: 2 tasks on each
    /// of the first 3 nodes, then 1), indexed by SLURM_NODEID.
    fn slurm_tasks_per_node(&self) -> Result<usize, EnvError> {
        const VAR: &str = "SLURM_TASKS_PER_NODE";
        const FORM: &str = "a SLURM task count list such as `4` or `2(x3),1`";
        let v = self.raw(
            VAR,
            "a SLURM task count list such as `2(x3),1` (srun sets it), or set SLURM_NTASKS_PER_NODE",
        )?;
        let malformed = || EnvError::Malformed {
            var: VAR,
            value: v.clone(),
            expected: FORM,
        };
        let mut counts: Vec<(usize, usize)> = Vec::new(); // (tasks, nodes)
        for part in v.trim().split(',') {
            let (n, reps) = match part.split_once("(x") {
                Some((n, rest)) => {
                    let reps = rest.strip_suffix(')').ok_or_else(malformed)?;
                    (n, reps.parse::<usize>().map_err(|_| malformed())?)
                }
                None => (part, 1),
            };
            let n = n.parse::<usize>().map_err(|_| malformed())?;
            if n == 0 || reps == 0 {
                return Err(malformed());
            }
            counts.push((n, reps));
        }
        let nodes: usize = counts.iter().map(|c| c.1).sum();
        if nodes == 1 || counts.len() == 1 {
            return Ok(counts[0].0);
        }
        // Nodes differ: this node's entry.
        let node = self.num(
            (
                "SLURM_NODEID",
                "a non-negative integer, this node's index (srun sets it)",
            ),
            0,
        )?;
        check_below(
            "SLURM_NODEID",
            node,
            "the node count of SLURM_TASKS_PER_NODE",
            nodes,
        )?;
        let mut first = 0;
        for (n, reps) in counts {
            if node < first + reps {
                return Ok(n);
            }
            first += reps;
        }
        Err(malformed())
    }
}

fn check_below(
    var: &'static str,
    value: usize,
    bound_var: &'static str,
    bound: usize,
) -> Result<(), EnvError> {
    if value < bound {
        Ok(())
    } else {
        Err(EnvError::OutOfRange {
            var,
            value,
            bound_var,
            bound,
        })
    }
}
