//! The core's configuration: every knob it takes from the environment is read in this file and
//! nowhere else. Whoever starts the core reads it once, at the edge (the Python bindings'
//! `Group::new`, an example's `main`; the NCCL plugin's `init` reads only the engine's knobs,
//! with `net`), and hands it down: `Setup::new`
//! and `Comm::new` take the `Config`; a multi-host group gives the TCP engine its `NetConfig`
//! (`Reactor::new`, `Listener::bind_vetted`, `Dialer::start`) and `transport::iface::listen_ip`
//! its variables; `Engine::with` takes whether to wake its worker. Tests build a `Config` from
//! variables they give (`Config::from_vars`) or take the defaults (`Config::default`).
//!
//! The knobs (docs/transport.md has the table; the defaults live with the types that use them):
//! - the planner's (`plan::Tuning`): WIRESPEED_ALGO, WIRESPEED_SLOT_BYTES, WIRESPEED_STAGE_MAX,
//!   WIRESPEED_BLOCK_BYTES, WIRESPEED_PAIR_STAGE_MAX, WIRESPEED_GATHER_RING_MIN,
//!   WIRESPEED_A2A_LEADERS_MAX;
//! - the TCP engine's (`transport::tcp::NetConfig`): WIRESPEED_NSTREAMS, WIRESPEED_CHUNK_BYTES,
//!   WIRESPEED_IO_THREADS, WIRESPEED_SOCKBUF, WIRESPEED_NET_SPIN_US, WIRESPEED_NOTSENT_LOWAT,
//!   WIRESPEED_JOB_SECRET, WIRESPEED_GROW_BYTES;
//! - when a multi-host group connects its ranks: WIRESPEED_CONNECT (`lazy_connect`);
//! - the shared-memory waits' WIRESPEED_SPIN_US and the engine's WIRESPEED_WORKER;
//! - where a rank is: WIRESPEED_HOSTID (its host id), and the variables
//!   `transport::iface::listen_ip` chooses a listening address from (WIRESPEED_IFNAME,
//!   GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, MASTER_ADDR, MASTER_PORT).
use crate::error::{Error, Result};
use crate::plan::{NetAlgo, ShmAlgo};
pub use crate::plan::Tuning;
use crate::transport::iface::IFNAME_VARS;
pub use crate::transport::tcp::NetConfig;
use crate::transport::tcp::Secret;
use std::collections::HashMap;
use std::time::Duration;

/// Where knobs come from: a variable's value, or None where it is unset.
pub type Vars<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment as `Vars` (a value that is not unicode counts as unset).
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Knobs given as data (`knobs`, e.g. a binding's `Group(..., knobs=...)`) before the process's
/// environment: a name in `knobs` is read there, any other from the environment.
pub fn knobs_over_env(knobs: &HashMap<String, String>) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| knobs.get(name).cloned().or_else(|| env(name))
}

/// What `transport::iface::listen_ip` reads, in its order.
const LISTEN_VARS: [&str; 5] = [IFNAME_VARS[0], IFNAME_VARS[1], IFNAME_VARS[2], "MASTER_ADDR", "MASTER_PORT"];

/// Every knob of the core, read once.
#[derive(Clone, Debug)]
pub struct Config {
    /// The planner's knobs.
    pub tuning: Tuning,
    /// The TCP engine's knobs, or why they are invalid: only a group that spans hosts uses them
    /// (`hosts::Setup::new` fails on them); the Python binding refuses them for every group, so
    /// a value set wrong is refused on one host too.
    pub net: Result<NetConfig>,
    /// WIRESPEED_CONNECT: `lazy` (unset: the default) connects a pair of ranks on different hosts
    /// on its first message, `eager` every such pair at setup (so an unreachable peer fails setup
    /// on every rank, as before). Kept as `net` is, and refused by the binding as `net` is.
    pub lazy_connect: Result<bool>,
    /// How long a shared-memory wait spins before it sleeps, in us (WIRESPEED_SPIN_US; unset or
    /// not a number: `SpinPolicy`'s default).
    pub spin_us: Option<u64>,
    /// Whether an async op wakes the engine's worker (WIRESPEED_WORKER: 0 no, anything else yes).
    pub wake_worker: bool,
    /// WIRESPEED_HOSTID as set (`host_id`).
    pub hostid: Option<String>,
    /// WIRESPEED_NSTREAMS is set: every opened stream is used, where unset a probe at setup
    /// chooses how many (hosts/probe.rs).
    pub nstreams_set: bool,
    /// The variables of LISTEN_VARS that are set, for `listen_var`.
    listen: Vec<(&'static str, String)>,
}

impl Config {
    /// Every knob from the process's environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(&env)
    }

    /// Every knob from `knobs` where given, else from the environment: what the bindings call
    /// once per group.
    pub fn from_knobs(knobs: &HashMap<String, String>) -> Result<Config> {
        Config::from_vars(&knobs_over_env(knobs))
    }

    /// Every knob from `var`. An invalid planner knob is an error here, with the first one's
    /// message (in the order of `tuning`); an invalid engine knob is kept in `net`.
    pub fn from_vars(var: Vars) -> Result<Config> {
        Ok(Config {
            tuning: tuning(var)?,
            net: net(var),
            lazy_connect: match var("WIRESPEED_CONNECT").as_deref().map(str::trim) {
                None | Some("") | Some("lazy") => Ok(true),
                Some("eager") => Ok(false),
                Some(v) => Err(Error::Unsupported(format!("WIRESPEED_CONNECT={v:?} is not a connection mode: choose lazy (on first use, the default) or eager (every remote pair at setup)"))),
            },
            spin_us: var("WIRESPEED_SPIN_US").and_then(|v| v.parse().ok()),
            wake_worker: var("WIRESPEED_WORKER").as_deref() != Some("0"),
            hostid: hostid(var),
            nstreams_set: var("WIRESPEED_NSTREAMS").is_some(),
            listen: LISTEN_VARS.iter().filter_map(|&name| var(name).map(|v| (name, v))).collect(),
        })
    }

    /// This rank's host id: WIRESPEED_HOSTID where set and not empty, else the machine's
    /// (`sys::host_id`). Ranks with equal ids share memory.
    pub fn host_id(&self) -> String {
        crate::sys::host_id(self.hostid.as_deref())
    }

    /// A variable of those that choose the listening address, as it was read (for
    /// `transport::iface::listen_ip`); None for any other name.
    pub fn listen_var(&self, name: &str) -> Option<String> {
        self.listen.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
    }
}

impl Default for Config {
    /// Every knob at its default: what `from_vars` gives when no variable is set.
    fn default() -> Config {
        Config::from_vars(&|_| None).expect("the defaults are valid")
    }
}

/// This machine's host id (`Config::host_id`) with nothing but WIRESPEED_HOSTID read: for a
/// caller that publishes the id before it makes a group (the bindings' `host_id()`), whatever
/// the other knobs hold.
pub fn host_id_from_env() -> String {
    crate::sys::host_id(hostid(&env).as_deref())
}

/// The host id a group given `knobs` takes (`Config::host_id`): WIRESPEED_HOSTID from `knobs`,
/// else from the environment, else the machine's; nothing else read. For a caller that publishes
/// it before making the group, where several groups of one process stand for several hosts
/// (benchmarks/scale_rehearsal.py).
pub fn host_id_from_knobs(knobs: &HashMap<String, String>) -> String {
    crate::sys::host_id(hostid(&knobs_over_env(knobs)).as_deref())
}

fn hostid(var: Vars) -> Option<String> {
    var("WIRESPEED_HOSTID")
}

/// The planner's knobs from `var` (`Tuning::default` where unset).
fn tuning(var: Vars) -> Result<Tuning> {
    let d = Tuning::default();
    // One value forces one planner: a one-host algorithm the one-host planner's choice, an
    // across-hosts algorithm the across-hosts planner's. The other planner is left to its cost
    // model, as with auto: `ring` on a one-host group, or `oneshot` on a group that spans hosts
    // (whose hosts' shm groups run only reduce and broadcast for it), changes nothing.
    let (shm_all_reduce, net_all_reduce) = match var("WIRESPEED_ALGO").unwrap_or_default().trim() {
        "" | "auto" => (None, None),
        "oneshot" => (Some(ShmAlgo::OneShot), None),
        "rsag" => (Some(ShmAlgo::Rsag), None),
        "staged" => (Some(ShmAlgo::Staged), None),
        "ring" => (None, Some(NetAlgo::Ring)),
        "hier" => (None, Some(NetAlgo::Hier)),
        "doubling" => (None, Some(NetAlgo::Doubling)),
        other => {
            return Err(Error::Unsupported(format!(
                "WIRESPEED_ALGO={other:?} is not an algorithm: choose auto, oneshot, staged, rsag (one host), ring, hier or doubling (across hosts)"
            )))
        }
    };
    let slot_bytes = bytes(var, "WIRESPEED_SLOT_BYTES", d.slot_bytes)?.max(4096).next_multiple_of(4096);
    let stage_max = bytes(var, "WIRESPEED_STAGE_MAX", d.stage_max)?;
    // Unset, the block follows the rank count (`Tuning::block_for`: 0).
    let block_bytes = match var("WIRESPEED_BLOCK_BYTES") {
        None => d.block_bytes,
        Some(_) => bytes(var, "WIRESPEED_BLOCK_BYTES", crate::plan::BLOCK)?.max(4096).next_multiple_of(64),
    };
    let pair_stage_max = bytes(var, "WIRESPEED_PAIR_STAGE_MAX", d.pair_stage_max)?;
    let gather_ring_min = bytes(var, "WIRESPEED_GATHER_RING_MIN", d.gather_ring_min)?;
    let a2a_leaders_max = bytes(var, "WIRESPEED_A2A_LEADERS_MAX", d.a2a_leaders_max)?;
    Ok(Tuning { shm_all_reduce, net_all_reduce, slot_bytes, stage_max, block_bytes, pair_stage_max, gather_ring_min, a2a_leaders_max })
}

/// The TCP engine's knobs from `var` (`NetConfig::default` where unset): a group's `Config`
/// holds them, and the NCCL plugin reads them with this at its init.
pub fn net(var: Vars) -> Result<NetConfig> {
    let d = NetConfig::default();
    Ok(NetConfig {
        nstreams: ranged(var, "WIRESPEED_NSTREAMS", d.nstreams, 1, 64)?,
        chunk: ranged(var, "WIRESPEED_CHUNK_BYTES", d.chunk, 4096, 1 << 30)?,
        io_threads: ranged(var, "WIRESPEED_IO_THREADS", d.io_threads, 1, 16)?,
        sockbuf: ranged(var, "WIRESPEED_SOCKBUF", d.sockbuf, 0, 1 << 30)?,
        spin: Duration::from_micros(ranged(var, "WIRESPEED_NET_SPIN_US", d.spin.as_micros() as usize, 0, 1_000_000)? as u64),
        notsent_lowat: ranged(var, "WIRESPEED_NOTSENT_LOWAT", d.notsent_lowat, 0, 1 << 30)?,
        secret: var("WIRESPEED_JOB_SECRET").and_then(|t| Secret::from_text(&t)),
        grow_bytes: match var("WIRESPEED_GROW_BYTES") {
            None => None,
            Some(_) => Some(bytes(var, "WIRESPEED_GROW_BYTES", 384 << 10)?),
        },
    })
}

fn bytes(var: Vars, name: &str, default: usize) -> Result<usize> {
    match var(name) {
        None => Ok(default),
        Some(v) => v.trim().parse::<usize>().map_err(|_| {
            Error::Unsupported(format!("{name}={v:?} is not a byte count: give a plain integer, e.g. {default}"))
        }),
    }
}

fn ranged(var: Vars, name: &str, default: usize, min: usize, max: usize) -> Result<usize> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(Error::Unsupported(format!("{name}={v:?}: give an integer from {min} to {max}, e.g. {default}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Knobs given as data are read before the environment (the bindings' `knobs`).
    #[test]
    fn given_knobs_come_before_the_environment() {
        let knobs = HashMap::from([("WIRESPEED_NSTREAMS".to_string(), "3".to_string())]);
        let cfg = Config::from_knobs(&knobs).unwrap();
        assert_eq!((cfg.net.unwrap().nstreams, cfg.nstreams_set), (3, true));
        let other = HashMap::from([("WIRESPEED_NSTREAMS".to_string(), "0".to_string())]);
        assert!(Config::from_knobs(&other).unwrap().net.is_err(), "a knob given out of range is refused as from the environment");
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn unset_variables_give_the_types_defaults() {
        let c = Config::default();
        let (t, d) = (c.tuning, Tuning::default());
        assert_eq!((t.shm_all_reduce, t.net_all_reduce), (None, None));
        assert_eq!((t.shm_all_reduce, t.net_all_reduce, t.slot_bytes, t.stage_max, t.block_bytes, t.pair_stage_max, t.gather_ring_min, t.a2a_leaders_max), (d.shm_all_reduce, d.net_all_reduce, d.slot_bytes, d.stage_max, d.block_bytes, d.pair_stage_max, d.gather_ring_min, d.a2a_leaders_max));
        assert_eq!((c.spin_us, c.wake_worker, c.hostid.as_deref(), c.listen_var("MASTER_ADDR")), (None, true, None, None));
        let (n, d) = (c.net.unwrap(), NetConfig::default());
        assert_eq!((n.nstreams, n.chunk, n.io_threads, n.sockbuf, n.spin, n.notsent_lowat), (d.nstreams, d.chunk, d.io_threads, d.sockbuf, d.spin, d.notsent_lowat));
    }

    #[test]
    fn knobs_are_read_from_the_given_variables() {
        let c = Config::from_vars(&vars(&[
            ("WIRESPEED_ALGO", " rsag "),
            ("WIRESPEED_SLOT_BYTES", "5000"),
            ("WIRESPEED_PAIR_STAGE_MAX", "0"),
            ("WIRESPEED_GATHER_RING_MIN", "12345"),
            ("WIRESPEED_A2A_LEADERS_MAX", "777"),
            ("WIRESPEED_NSTREAMS", "3"),
            ("WIRESPEED_GROW_BYTES", "0"),
            ("WIRESPEED_NET_SPIN_US", "7"),
            ("WIRESPEED_SPIN_US", "20"),
            ("WIRESPEED_WORKER", "0"),
            ("WIRESPEED_HOSTID", "h1"),
            ("WIRESPEED_IFNAME", "lo"),
            ("MASTER_PORT", "1234"),
        ]))
        .unwrap();
        assert_eq!((c.tuning.shm_all_reduce, c.tuning.net_all_reduce, c.tuning.slot_bytes, c.tuning.pair_stage_max), (Some(ShmAlgo::Rsag), None, 8192, 0));
        assert_eq!((c.tuning.gather_ring_min, c.tuning.a2a_leaders_max), (12345, 777));
        let n = c.net.clone().unwrap();
        assert_eq!((n.nstreams, n.spin, n.grow_bytes), (3, Duration::from_micros(7), Some(0)));
        assert_eq!(Config::from_vars(&vars(&[])).unwrap().net.unwrap().grow_bytes, None);
        let bad = Config::from_vars(&vars(&[("WIRESPEED_GROW_BYTES", "1M")])).unwrap().net.unwrap_err();
        assert!(bad.to_string().contains("WIRESPEED_GROW_BYTES=\"1M\" is not a byte count"), "{bad}");
        assert_eq!((c.spin_us, c.wake_worker, c.host_id()), (Some(20), false, "h1".to_string()));
        assert_eq!((c.listen_var("WIRESPEED_IFNAME"), c.listen_var("MASTER_PORT")), (Some("lo".into()), Some("1234".into())));
        assert_eq!(c.listen_var("WIRESPEED_ALGO"), None);
        // lenient as before: a SPIN_US that is no number is the default, a WORKER other than 0 is on
        let c = Config::from_vars(&vars(&[("WIRESPEED_SPIN_US", "x"), ("WIRESPEED_WORKER", "no")])).unwrap();
        assert_eq!((c.spin_us, c.wake_worker), (None, true));
        // an empty host id is the machine's
        assert_ne!(Config::from_vars(&vars(&[("WIRESPEED_HOSTID", "")])).unwrap().host_id(), "");
    }

    #[test]
    fn each_algorithm_forces_only_the_planner_it_names() {
        let algo = |v: &'static str| {
            let t = Config::from_vars(&move |k: &str| (k == "WIRESPEED_ALGO").then(|| v.to_string())).unwrap().tuning;
            (t.shm_all_reduce, t.net_all_reduce)
        };
        assert_eq!(algo("auto"), (None, None));
        assert_eq!(algo(""), (None, None));
        assert_eq!(algo("oneshot"), (Some(ShmAlgo::OneShot), None));
        assert_eq!(algo("staged"), (Some(ShmAlgo::Staged), None));
        assert_eq!(algo("rsag"), (Some(ShmAlgo::Rsag), None));
        assert_eq!(algo("ring"), (None, Some(NetAlgo::Ring)));
        assert_eq!(algo(" hier"), (None, Some(NetAlgo::Hier)));
        assert_eq!(algo("doubling"), (None, Some(NetAlgo::Doubling)));
    }

    #[test]
    fn invalid_knobs_are_refused_with_the_same_messages() {
        let e = Config::from_vars(&vars(&[("WIRESPEED_ALGO", "fast")])).unwrap_err();
        assert!(e.to_string().contains("WIRESPEED_ALGO=\"fast\" is not an algorithm: choose auto,"), "{e}");
        let e = Config::from_vars(&vars(&[("WIRESPEED_STAGE_MAX", "1k")])).unwrap_err();
        assert!(e.to_string().contains("WIRESPEED_STAGE_MAX=\"1k\" is not a byte count: give a plain integer, e.g. 65536"), "{e}");
        // an engine knob fails only what uses the engine
        let c = Config::from_vars(&vars(&[("WIRESPEED_NSTREAMS", "0")])).unwrap();
        let e = c.net.unwrap_err();
        assert!(e.to_string().contains("WIRESPEED_NSTREAMS=\"0\": give an integer from 1 to 64, e.g. 12"), "{e}");
        let e = net(&vars(&[("WIRESPEED_CHUNK_BYTES", "4095")])).unwrap_err();
        assert!(e.to_string().contains("WIRESPEED_CHUNK_BYTES=\"4095\": give an integer from 4096 to 1073741824, e.g. 524288"), "{e}");
    }
}
