//! Rendezvous configuration: the torchrun, SLURM and Open MPI environments
//! (through a lookup map, never the process environment) and the builder.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use chorus_store::rendezvous::{ConfigError, EnvError, RendezvousConfig, Source, DEFAULT_TIMEOUT};
use rand::{Rng, SeedableRng};

type Vars = HashMap<&'static str, String>;

fn vars(pairs: &[(&'static str, &str)]) -> Vars {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn parse(v: &Vars) -> Result<RendezvousConfig, EnvError> {
    RendezvousConfig::from_lookup(|k| v.get(k).cloned())
}

fn torchrun() -> Vars {
    vars(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node07"),
        ("MASTER_PORT", "29500"),
    ])
}

fn slurm() -> Vars {
    vars(&[
        ("SLURM_PROCID", "6"),
        ("SLURM_NTASKS", "7"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", "3"),
        ("SLURM_TASKS_PER_NODE", "2(x3),1"),
        ("MASTER_ADDR", "10.1.2.3"),
        ("MASTER_PORT", "4000"),
    ])
}

fn ompi() -> Vars {
    vars(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "::1"),
        ("MASTER_PORT", "4001"),
    ])
}

fn ranks(c: &RendezvousConfig) -> [usize; 4] {
    [
        c.rank(),
        c.world_size(),
        c.local_rank(),
        c.local_world_size(),
    ]
}

fn err(v: &Vars) -> String {
    parse(v).expect_err("config should be refused").to_string()
}

#[test]
fn torchrun_variables_are_read() {
    let c = parse(&torchrun()).unwrap();
    assert_eq!(ranks(&c), [5, 8, 1, 4]);
    assert_eq!(c.source(), Source::Torchrun);
    assert_eq!((c.master_addr(), c.master_port()), ("node07", 29500));
    assert_eq!(c.timeout(), DEFAULT_TIMEOUT);
    assert_eq!(c.token(), None);
    // A host name binds every interface; see RendezvousConfig::bind_addr.
    assert_eq!(
        c.bind_addr(),
        "0.0.0.0:29500".parse::<SocketAddr>().unwrap()
    );
}

#[test]
fn random_torchrun_layouts_round_trip() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for _ in 0..500 {
        let nodes = rng.gen_range(1..=64usize);
        let per_node = rng.gen_range(1..=16usize);
        let world = nodes * per_node;
        let rank = rng.gen_range(0..world);
        let port: u16 = rng.gen_range(1..=u16::MAX);
        let v = vars(&[
            ("RANK", &rank.to_string()),
            ("WORLD_SIZE", &world.to_string()),
            ("LOCAL_RANK", &(rank % per_node).to_string()),
            ("LOCAL_WORLD_SIZE", &per_node.to_string()),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
        ]);
        let c = parse(&v).unwrap();
        assert_eq!(ranks(&c), [rank, world, rank % per_node, per_node]);
        assert_eq!(c.master_port(), port);
    }
}

#[test]
fn each_missing_torchrun_variable_is_named() {
    for var in [
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        let mut v = torchrun();
        v.remove(var);
        let e = parse(&v).unwrap_err();
        assert!(
            matches!(&e, EnvError::Missing { var: got, .. } if *got == var),
            "{var}: {e:?}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("{var} is not set: expected ")),
            "{e}"
        );
    }
}

#[test]
fn malformed_values_are_named_with_their_form() {
    let cases: &[(&'static str, &str, &str)] = &[
        ("RANK", "abc", r#"RANK="abc" is not a non-negative integer"#),
        ("RANK", "-1", r#"RANK="-1" is not a non-negative integer"#),
        ("RANK", "", r#"RANK="" is not a non-negative integer"#),
        (
            "WORLD_SIZE",
            "0",
            r#"WORLD_SIZE="0" is not a positive integer"#,
        ),
        (
            "WORLD_SIZE",
            "8.0",
            r#"WORLD_SIZE="8.0" is not a positive integer"#,
        ),
        (
            "LOCAL_RANK",
            "one",
            r#"LOCAL_RANK="one" is not a non-negative integer"#,
        ),
        (
            "LOCAL_WORLD_SIZE",
            "0",
            r#"LOCAL_WORLD_SIZE="0" is not a positive integer"#,
        ),
        (
            "MASTER_PORT",
            "99999",
            r#"MASTER_PORT="99999" is not a TCP port in 1..=65535"#,
        ),
        (
            "MASTER_PORT",
            "0",
            r#"MASTER_PORT="0" is not a TCP port in 1..=65535"#,
        ),
        (
            "MASTER_PORT",
            "http",
            r#"MASTER_PORT="http" is not a TCP port in 1..=65535"#,
        ),
        (
            "MASTER_ADDR",
            "",
            r#"MASTER_ADDR="" is not a host name or IP address"#,
        ),
        (
            "MASTER_ADDR",
            "a b",
            r#"MASTER_ADDR="a b" is not a host name or IP address"#,
        ),
        (
            "CHORUS_RENDEZVOUS_TIMEOUT",
            "soon",
            r#"CHORUS_RENDEZVOUS_TIMEOUT="soon" is not a positive number of seconds"#,
        ),
        (
            "CHORUS_RENDEZVOUS_TIMEOUT",
            "0",
            r#"CHORUS_RENDEZVOUS_TIMEOUT="0" is not a positive number of seconds"#,
        ),
    ];
    for (var, value, msg) in cases {
        let mut v = torchrun();
        v.insert(var, value.to_string());
        assert_eq!(err(&v), *msg);
    }
}

#[test]
fn out_of_range_values_name_both_variables() {
    let mut v = torchrun();
    v.insert("WORLD_SIZE", "4".into());
    assert_eq!(err(&v), "RANK=5 is not below WORLD_SIZE=4");
    let mut v = torchrun();
    v.insert("LOCAL_RANK", "4".into());
    assert_eq!(err(&v), "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4");
    let mut v = torchrun();
    v.insert("LOCAL_WORLD_SIZE", "9".into());
    v.insert("LOCAL_RANK", "0".into());
    assert_eq!(err(&v), "LOCAL_WORLD_SIZE=9 is larger than WORLD_SIZE=8");
}

#[test]
fn optional_variables() {
    let mut v = torchrun();
    v.insert("CHORUS_RENDEZVOUS_TIMEOUT", "2.5".into());
    v.insert("CHORUS_STORE_TOKEN", "s3cret".into());
    let c = parse(&v).unwrap();
    assert_eq!(c.timeout(), Duration::from_millis(2500));
    assert_eq!(c.token(), Some("s3cret"));
    assert!(
        !format!("{c:?}").contains("s3cret"),
        "Debug must hide the token"
    );
    v.insert("CHORUS_STORE_TOKEN", String::new());
    assert!(err(&v).starts_with(r#"CHORUS_STORE_TOKEN="" is not a non-empty shared secret"#));
}

#[test]
fn a_single_rank_needs_no_master() {
    let v = vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
    ]);
    let c = parse(&v).unwrap();
    assert_eq!((c.master_addr(), c.master_port()), ("127.0.0.1", 0));
    assert_eq!(c.bind_addr(), "127.0.0.1:0".parse::<SocketAddr>().unwrap());
}

#[test]
fn nothing_set_asks_for_a_launcher() {
    let e = parse(&Vars::new()).unwrap_err();
    assert_eq!(e, EnvError::NoLauncher);
    let msg = e.to_string();
    for name in ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "chorus-run"] {
        assert!(msg.contains(name), "{msg}");
    }
}

#[test]
fn slurm_variables_are_read() {
    // Node 3 of "2(x3),1" runs one task.
    let c = parse(&slurm()).unwrap();
    assert_eq!(ranks(&c), [6, 7, 0, 1]);
    assert_eq!(c.source(), Source::Slurm);
    assert_eq!(
        c.bind_addr(),
        "10.1.2.3:4000".parse::<SocketAddr>().unwrap()
    );
    // Node 1 runs two.
    let mut v = slurm();
    v.insert("SLURM_NODEID", "1".into());
    v.insert("SLURM_PROCID", "3".into());
    v.insert("SLURM_LOCALID", "1".into());
    assert_eq!(ranks(&parse(&v).unwrap()), [3, 7, 1, 2]);
    // SLURM_NTASKS_PER_NODE wins over SLURM_TASKS_PER_NODE.
    let mut v = slurm();
    v.insert("SLURM_NTASKS_PER_NODE", "3".into());
    v.insert("SLURM_LOCALID", "2".into());
    assert_eq!(ranks(&parse(&v).unwrap()), [6, 7, 2, 3]);
    // A uniform list needs no node id.
    let mut v = slurm();
    v.remove("SLURM_NODEID");
    v.insert("SLURM_TASKS_PER_NODE", "4(x2)".into());
    v.insert("SLURM_NTASKS", "8".into());
    v.insert("SLURM_LOCALID", "2".into());
    assert_eq!(ranks(&parse(&v).unwrap()), [6, 8, 2, 4]);
}

#[test]
fn slurm_errors_are_named() {
    for var in [
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_TASKS_PER_NODE",
        "SLURM_NODEID",
    ] {
        let mut v = slurm();
        v.remove(var);
        let e = parse(&v).unwrap_err();
        assert!(
            matches!(&e, EnvError::Missing { var: got, .. } if *got == var),
            "{var}: {e:?}"
        );
    }
    for list in ["", "2(x3", "2(3),1", "a", "0", "2(x0)", "2,,1"] {
        let mut v = slurm();
        v.insert("SLURM_TASKS_PER_NODE", list.into());
        assert!(
            err(&v).starts_with(&format!(
                "SLURM_TASKS_PER_NODE={list:?} is not a SLURM task count list"
            )),
            "{list}: {}",
            err(&v)
        );
    }
    let mut v = slurm();
    v.insert("SLURM_NODEID", "4".into());
    assert_eq!(
        err(&v),
        "SLURM_NODEID=4 is not below the node count of SLURM_TASKS_PER_NODE=4"
    );
    let mut v = slurm();
    v.insert("SLURM_PROCID", "7".into());
    assert_eq!(err(&v), "SLURM_PROCID=7 is not below SLURM_NTASKS=7");
    let mut v = slurm();
    v.insert("SLURM_LOCALID", "1".into());
    assert_eq!(
        err(&v),
        "SLURM_LOCALID=1 is not below SLURM_TASKS_PER_NODE=1"
    );
    let mut v = slurm();
    v.insert("SLURM_PROCID", "x".into());
    assert_eq!(err(&v), r#"SLURM_PROCID="x" is not a non-negative integer"#);
    // The master still has to come from the environment.
    let mut v = slurm();
    v.remove("MASTER_ADDR");
    let msg = err(&v);
    assert!(
        msg.starts_with("MASTER_ADDR is not set") && msg.contains("srun"),
        "{msg}"
    );
}

#[test]
fn open_mpi_variables_are_read() {
    let c = parse(&ompi()).unwrap();
    assert_eq!(ranks(&c), [3, 4, 1, 2]);
    assert_eq!(c.source(), Source::OpenMpi);
    assert_eq!(c.bind_addr(), "[::1]:4001".parse::<SocketAddr>().unwrap());
    for var in [
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MASTER_PORT",
    ] {
        let mut v = ompi();
        v.remove(var);
        let e = parse(&v).unwrap_err();
        assert!(
            matches!(&e, EnvError::Missing { var: got, .. } if *got == var),
            "{var}: {e:?}"
        );
    }
    let mut v = ompi();
    v.insert("OMPI_COMM_WORLD_RANK", "4".into());
    assert_eq!(
        err(&v),
        "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"
    );
}

#[test]
fn torchrun_wins_over_slurm_and_open_mpi() {
    let mut v = slurm();
    v.extend(ompi());
    v.extend(torchrun());
    let c = parse(&v).unwrap();
    assert_eq!((c.source(), ranks(&c)), (Source::Torchrun, [5, 8, 1, 4]));
    v.retain(|k, _| {
        !matches!(
            *k,
            "RANK" | "WORLD_SIZE" | "LOCAL_RANK" | "LOCAL_WORLD_SIZE"
        )
    });
    assert_eq!(parse(&v).unwrap().source(), Source::Slurm);
    v.retain(|k, _| !k.starts_with("SLURM_"));
    assert_eq!(parse(&v).unwrap().source(), Source::OpenMpi);
}

#[test]
fn builder_builds_and_checks() {
    let c = RendezvousConfig::builder()
        .rank(2)
        .world_size(4)
        .master_addr("localhost")
        .master_port(1234)
        .timeout(Duration::from_secs(3))
        .token("t")
        .build()
        .unwrap();
    assert_eq!(ranks(&c), [2, 4, 2, 4]);
    assert_eq!(c.source(), Source::Builder);
    assert_eq!(
        c.bind_addr(),
        "127.0.0.1:1234".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        (c.timeout(), c.token()),
        (Duration::from_secs(3), Some("t"))
    );

    let b = || RendezvousConfig::builder().master_addr("h").master_port(1);
    assert_eq!(b().world_size(2).build(), Err(ConfigError::Missing("rank")));
    assert_eq!(b().rank(0).build(), Err(ConfigError::Missing("world_size")));
    assert_eq!(
        b().rank(2).world_size(2).build().unwrap_err().to_string(),
        "rendezvous config: rank 2 is not below world_size 2"
    );
    assert!(b().rank(0).world_size(0).build().is_err());
    assert!(matches!(
        b().rank(1)
            .world_size(4)
            .local_rank(2)
            .local_world_size(2)
            .build(),
        Err(ConfigError::OutOfRange {
            field: "local_rank",
            ..
        })
    ));
    assert_eq!(
        RendezvousConfig::builder()
            .rank(0)
            .world_size(2)
            .master_port(1)
            .build(),
        Err(ConfigError::Missing("master_addr"))
    );
    assert_eq!(
        RendezvousConfig::builder()
            .rank(0)
            .world_size(2)
            .master_addr("h")
            .build(),
        Err(ConfigError::Missing("master_port"))
    );
    assert!(b().rank(0).world_size(2).master_port(0).build().is_err());
    assert!(b()
        .rank(0)
        .world_size(2)
        .timeout(Duration::ZERO)
        .build()
        .is_err());
    assert!(b().rank(0).world_size(2).token("").build().is_err());
    // One rank: no master needed, any free port.
    let c = RendezvousConfig::builder()
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    assert_eq!((c.master_addr(), c.master_port()), ("127.0.0.1", 0));
}

#[test]
fn torchruns_agent_store_is_used_not_hosted() {
    use chorus_store::rendezvous::StoreHost;
    let mut v = torchrun();
    assert_eq!(*parse(&v).unwrap().store_host(), StoreHost::Rank0);
    v.insert("TORCHELASTIC_USE_AGENT_STORE", "False".into());
    assert_eq!(*parse(&v).unwrap().store_host(), StoreHost::Rank0);

    v.insert("TORCHELASTIC_USE_AGENT_STORE", "True".into());
    v.insert("TORCHELASTIC_RUN_ID", "job42".into());
    v.insert("TORCHELASTIC_RESTART_COUNT", "3".into());
    let cfg = parse(&v).unwrap();
    assert_eq!(
        *cfg.store_host(),
        StoreHost::Torch {
            namespace: "chorus/job42/3".into()
        }
    );
    assert_eq!(cfg.master_addr(), "node07");
    assert_eq!(cfg.master_port(), 29500);

    // Each restart of the workers gets a namespace of its own.
    v.insert("TORCHELASTIC_RESTART_COUNT", "4".into());
    assert_ne!(parse(&v).unwrap().store_host(), cfg.store_host());

    v.insert("TORCHELASTIC_RESTART_COUNT", "-1".into());
    assert!(matches!(
        parse(&v),
        Err(EnvError::Malformed {
            var: "TORCHELASTIC_RESTART_COUNT",
            ..
        })
    ));
    v.remove("TORCHELASTIC_RESTART_COUNT");
    v.remove("TORCHELASTIC_RUN_ID");
    assert_eq!(
        *parse(&v).unwrap().store_host(),
        StoreHost::Torch {
            namespace: "chorus/none/0".into()
        }
    );
}

#[test]
fn an_agent_store_needs_its_address_even_for_one_rank() {
    let v = vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ]);
    assert!(matches!(
        parse(&v),
        Err(EnvError::Missing {
            var: "MASTER_ADDR",
            ..
        })
    ));
    let mut v = v;
    v.insert("MASTER_ADDR", "127.0.0.1".into());
    v.insert("MASTER_PORT", "0".into());
    assert!(matches!(
        parse(&v),
        Err(EnvError::Malformed {
            var: "MASTER_PORT",
            ..
        })
    ));
}

#[test]
fn the_builder_can_name_a_pytorch_store() {
    use chorus_store::rendezvous::StoreHost;
    let b = || {
        RendezvousConfig::builder()
            .rank(0)
            .world_size(1)
            .torch_store("mine")
    };
    assert!(matches!(
        b().build(),
        Err(ConfigError::Missing("master_addr"))
    ));
    assert!(matches!(
        b().master_addr("127.0.0.1").master_port(0).build(),
        Err(ConfigError::Invalid(_))
    ));
    let cfg = b()
        .master_addr("127.0.0.1")
        .master_port(29400)
        .build()
        .unwrap();
    assert_eq!(
        *cfg.store_host(),
        StoreHost::Torch {
            namespace: "mine".into()
        }
    );
    assert!(matches!(
        RendezvousConfig::builder()
            .rank(0)
            .world_size(2)
            .master_addr("h")
            .master_port(1)
            .torch_store("")
            .build(),
        Err(ConfigError::Invalid(_))
    ));
}

#[test]
fn chorus_runs_store_is_used_not_hosted() {
    use chorus_store::rendezvous::{StoreHost, STORE_HOST_ENV};
    let mut v = torchrun();
    v.insert(STORE_HOST_ENV, "launcher".into());
    let c = parse(&v).unwrap();
    assert_eq!(*c.store_host(), StoreHost::Launcher);
    assert_eq!(c.master_port(), 29500);
    v.insert(STORE_HOST_ENV, "rank0".into());
    assert_eq!(*parse(&v).unwrap().store_host(), StoreHost::Rank0);
    v.insert(STORE_HOST_ENV, "agent".into());
    let e = parse(&v).unwrap_err().to_string();
    assert!(
        e.contains(STORE_HOST_ENV) && e.contains("launcher or rank0"),
        "{e}"
    );
    // torchrun's agent store wins: it is the one serving.
    v.insert(STORE_HOST_ENV, "launcher".into());
    v.insert("TORCHELASTIC_USE_AGENT_STORE", "True".into());
    assert!(matches!(
        parse(&v).unwrap().store_host(),
        StoreHost::Torch { .. }
    ));
    // The builder's equivalent; a served store has a port of its own.
    let b = RendezvousConfig::builder()
        .rank(1)
        .world_size(2)
        .master_addr("node0")
        .master_port(29500)
        .launcher_store()
        .build()
        .unwrap();
    assert_eq!(*b.store_host(), StoreHost::Launcher);
    let zero = RendezvousConfig::builder()
        .rank(0)
        .world_size(1)
        .master_addr("127.0.0.1")
        .master_port(0)
        .launcher_store()
        .build();
    assert!(matches!(zero, Err(ConfigError::Invalid(_))), "{zero:?}");
}
