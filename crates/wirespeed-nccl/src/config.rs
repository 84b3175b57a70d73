//! The plugin's knobs and its devices (the network interfaces it offers NCCL).
//!
//! Knobs, read once at the first `init` and handed to the engine from there:
//! - the engine's: WIRESPEED_NSTREAMS, WIRESPEED_CHUNK_BYTES, WIRESPEED_IO_THREADS,
//!   WIRESPEED_SOCKBUF, WIRESPEED_NET_SPIN_US, WIRESPEED_NOTSENT_LOWAT (a `NetConfig`, read by the
//!   core's `wirespeed_core::net::config`, as the groups read them);
//! - which interfaces: WIRESPEED_IFNAME, else NCCL_SOCKET_IFNAME, in NCCL's syntax (a comma list
//!   of name prefixes; `=` before the list for exact names; `^` for an exclusion list; parsed by
//!   wirespeed_core::net::iface, as the groups parse it); unset,
//!   every interface that is up except docker* and loopback, as NCCL's socket transport does;
//! - WIRESPEED_NET_ALLOW_LOOPBACK=1 lets a loopback interface be a device (one-machine tests:
//!   every "host" then shares 127.0.0.1, which across real hosts would connect a rank to itself);
//! - WIRESPEED_SOCKET_FAMILY, else NCCL_SOCKET_FAMILY: AF_INET or AF_INET6 to use only that
//!   address family; unset, an interface's IPv4 address is preferred over its IPv6 one.
//!
//! Streams per connection: the listening side's WIRESPEED_NSTREAMS travels in the handle; the
//! connecting side opens that many, or, from API v11 on, fewer when NCCL's `setNetAttr` hint says
//! it drives several flows to one peer at once (`streams_for`), unless WIRESPEED_NSTREAMS is set.
use std::ffi::CString;
use std::net::IpAddr;
pub use wirespeed_core::net::iface::Family;
use wirespeed_core::net::iface::{interfaces, IfSpec, Iface};
use wirespeed_core::net::{self as config, NetConfig};

/// As many interfaces as NCCL's socket transport offers at most.
const MAX_DEVICES: usize = 16;
/// NCCL's socket transport assumes 10 Gbit/s when the kernel reports no speed (veth, lo).
const DEFAULT_SPEED_MBPS: i32 = 10_000;

#[derive(Debug)]
pub struct PluginConfig {
    pub net: NetConfig,
    /// The interface selection and the variable it came from (None: the default).
    pub ifname: Option<(&'static str, String)>,
    pub allow_loopback: bool,
    pub family: Option<Family>,
    /// WIRESPEED_NSTREAMS is set: its count is used as given, whatever NCCL's hint says.
    pub nstreams_set: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl PluginConfig {
    pub fn from_env() -> Result<PluginConfig, String> {
        let net = config::config(&config::env).map_err(|e| e.to_string())?;
        let ifname = ["WIRESPEED_IFNAME", "NCCL_SOCKET_IFNAME"].into_iter().find_map(|v| env(v).map(|s| (v, s)));
        let allow_loopback = match env("WIRESPEED_NET_ALLOW_LOOPBACK").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(format!("WIRESPEED_NET_ALLOW_LOOPBACK={v:?}: give 0 or 1")),
        };
        let family = match ["WIRESPEED_SOCKET_FAMILY", "NCCL_SOCKET_FAMILY"].into_iter().find_map(|v| env(v).map(|s| (v, s))) {
            None => None,
            Some((_, s)) if s.trim().eq_ignore_ascii_case("AF_INET") => Some(Family::V4),
            Some((_, s)) if s.trim().eq_ignore_ascii_case("AF_INET6") => Some(Family::V6),
            Some((var, s)) => return Err(format!("{var}={s:?}: give AF_INET or AF_INET6")),
        };
        let nstreams_set = env("WIRESPEED_NSTREAMS").is_some();
        Ok(PluginConfig { net, ifname, allow_loopback, family, nstreams_set })
    }

    /// The effective values, for the one INFO line at init.
    pub fn describe(&self, devices: &[Device]) -> String {
        let n = &self.net;
        let ifs = match &self.ifname {
            Some((var, v)) => format!("{var}={v}"),
            None => "default (^docker,lo)".into(),
        };
        let devs: Vec<String> = devices.iter().map(|d| format!("{}:{}", d.name.to_string_lossy(), d.addr)).collect();
        format!(
            "WIRESPEED_NSTREAMS={} WIRESPEED_CHUNK_BYTES={} WIRESPEED_IO_THREADS={} WIRESPEED_SOCKBUF={} WIRESPEED_NET_SPIN_US={} WIRESPEED_NOTSENT_LOWAT={} interfaces {ifs} loopback {} family {} -> devices [{}]",
            n.nstreams,
            n.chunk,
            n.io_threads,
            if n.sockbuf == 0 { "0 (kernel autotuning)".to_string() } else { n.sockbuf.to_string() },
            n.spin.as_micros(),
            n.notsent_lowat,
            if self.allow_loopback { "allowed" } else { "refused" },
            match self.family {
                None => "any (IPv4 first)",
                Some(Family::V4) => "AF_INET",
                Some(Family::V6) => "AF_INET6",
            },
            devs.join(", ")
        )
    }
}

/// How many peers, and flows (NCCL channels) per peer, NCCL says one direction of a communicator
/// drives at once: the `max` fields of its ncclNetCommAttr_t (abi::NetCommAttr). A value of 0 or
/// less (NCCL_NET_ATTR_UNDEF) says nothing and counts as 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    pub peers: i32,
    pub flows: i32,
}

/// The streams one connection opens. `base` is what the plugin uses for a lone connection to a
/// peer (the listener's WIRESPEED_NSTREAMS, from the handle), the flows a capped link between two
/// hosts needs. With NCCL's hint and WIRESPEED_NSTREAMS unset, the `flows` connections NCCL may
/// drive to one peer at once (its channels) share those `base` streams: `base / flows`, rounded
/// up so together they never carry fewer than `base`, never below 1 or above `base`. The peer
/// count is not divided in: different peers are different links (other hosts), each needing its
/// own flows, so fewer streams per peer would leave a capped link short. Set (`forced`), or
/// without a hint, `base` as it is.
pub fn streams_for(base: usize, forced: bool, hint: Option<Concurrency>) -> usize {
    let Some(h) = hint.filter(|_| !forced) else { return base };
    let flows = usize::try_from(h.flows).unwrap_or(0).max(1);
    base.div_ceil(flows).clamp(1, base.max(1))
}

/// One network interface offered to NCCL as a device.
#[derive(Debug)]
pub struct Device {
    pub name: CString,
    pub addr: IpAddr,
    /// The IPv6 scope (interface index) for a link-local address, else 0.
    pub scope_id: u32,
    pub pci_path: Option<CString>,
    pub speed_mbps: i32,
}

fn sys_attr(name: &str, attr: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/{attr}")).ok().map(|s| s.trim().to_string())
}

fn device(f: &Iface, addr: IpAddr, scope_id: u32) -> Device {
    let pci_path = std::fs::canonicalize(format!("/sys/class/net/{}/device", f.name))
        .ok()
        .and_then(|p| CString::new(p.to_string_lossy().into_owned()).ok());
    let speed_mbps = sys_attr(&f.name, "speed").and_then(|s| s.parse::<i32>().ok()).filter(|&s| s > 0).unwrap_or(DEFAULT_SPEED_MBPS);
    Device { name: CString::new(f.name.clone()).unwrap_or_default(), addr, scope_id, pci_path, speed_mbps }
}

/// The devices to offer NCCL, or why there are none (the message says what to set).
pub fn find_devices(cfg: &PluginConfig) -> Result<Vec<Device>, String> {
    let all = interfaces();
    let default_spec = IfSpec::parse("^docker,lo");
    let spec = cfg.ifname.as_ref().map(|(_, v)| IfSpec::parse(v)).unwrap_or(default_spec);
    let mut out = Vec::new();
    let mut refused_loopback = Vec::new();
    for f in &all {
        if !f.up || !spec.selects(&f.name) {
            continue;
        }
        let Some((addr, scope)) = f.pick_addr(cfg.family) else { continue };
        if f.loopback && !cfg.allow_loopback {
            refused_loopback.push(f.name.clone());
            continue;
        }
        out.push(device(f, addr, scope));
        if out.len() == MAX_DEVICES {
            break;
        }
    }
    // Nothing else on the machine: a one-machine test may use loopback when it says so.
    if out.is_empty() && cfg.ifname.is_none() && cfg.allow_loopback {
        for f in all.iter().filter(|f| f.up && f.loopback) {
            if let Some((addr, scope)) = f.pick_addr(cfg.family) {
                out.push(device(f, addr, scope));
            }
        }
    }
    if out.is_empty() {
        let which = match &cfg.ifname {
            Some((var, v)) => format!("{var}={v}"),
            None => "the default selection (every interface but docker* and lo)".into(),
        };
        let hint = if refused_loopback.is_empty() {
            "set WIRESPEED_IFNAME to an interface that is up and has an address (see `ip addr`)".to_string()
        } else {
            format!("{} is loopback: set WIRESPEED_NET_ALLOW_LOOPBACK=1 for a one-machine test", refused_loopback.join(", "))
        };
        return Err(format!("no usable network interface for {which}: {hint}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn cfg(ifname: Option<&str>, allow_loopback: bool, family: Option<Family>) -> PluginConfig {
        PluginConfig { net: NetConfig::default(), ifname: ifname.map(|v| ("WIRESPEED_IFNAME", v.to_string())), allow_loopback, family, nstreams_set: false }
    }

    fn hint(peers: i32, flows: i32) -> Option<Concurrency> {
        Some(Concurrency { peers, flows })
    }

    #[test]
    fn streams_share_the_base_count_among_the_connections_nccl_drives_at_once() {
        // No hint (API v8..v10, or NCCL said nothing yet): the base count.
        assert_eq!(streams_for(12, false, None), 12);
        // one flow per peer: the lone connection's count, however many peers
        assert_eq!(streams_for(12, false, hint(1, 1)), 12);
        assert_eq!(streams_for(12, false, hint(8, 1)), 12);
        // 2 flows (channels) to a peer share its 12: 6 each
        assert_eq!(streams_for(12, false, hint(2, 2)), 6);
        assert_eq!(streams_for(12, false, hint(4, 5)), 3);   // rounded up: 15 to the peer
        assert_eq!(streams_for(12, false, hint(8, 32)), 1);
        assert_eq!(streams_for(1, false, hint(4, 4)), 1);
        assert_eq!(streams_for(12, false, hint(i32::MAX, i32::MAX)), 1);
        // unsaid (-1) or 0: one
        assert_eq!(streams_for(12, false, hint(-1, -1)), 12);
        assert_eq!(streams_for(12, false, hint(4, 0)), 12);
        assert_eq!(streams_for(12, false, hint(-1, 2)), 6);
        assert_eq!(streams_for(8, true, hint(4, 2)), 8);
        assert_eq!(streams_for(8, true, None), 8);
    }

    #[test]
    fn loopback_only_when_allowed() {
        let e = find_devices(&cfg(Some("lo"), false, None)).unwrap_err();
        assert!(e.contains("WIRESPEED_NET_ALLOW_LOOPBACK=1"), "{e}");
        let d = find_devices(&cfg(Some("lo"), true, None)).unwrap();
        assert_eq!(d[0].name.to_str().unwrap(), "lo");
        assert_eq!(d[0].addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(d[0].pci_path.is_none(), "lo has no PCI device");
        let d = find_devices(&cfg(Some("=lo"), true, Some(Family::V6))).unwrap();
        assert_eq!(d[0].addr, IpAddr::V6(Ipv6Addr::LOCALHOST));
    }

    #[test]
    fn a_selection_means_the_same_to_the_plugin_and_to_the_groups() {
        // NCCL_SOCKET_IFNAME=l: a prefix of "lo", in NCCL's syntax, for both
        let vars = |k: &str| (k == "NCCL_SOCKET_IFNAME").then(|| "l".to_string());
        let (group_ip, how) = wirespeed_core::net::iface::listen_ip_from(&vars, &interfaces()).unwrap();
        let cfg = PluginConfig { ifname: Some(("NCCL_SOCKET_IFNAME", "l".into())), ..cfg(None, true, None) };
        let d = find_devices(&cfg).unwrap();
        assert_eq!((d[0].name.to_str().unwrap(), d[0].addr), ("lo", group_ip), "groups chose {how}");
    }

    #[test]
    fn an_unknown_interface_is_a_clear_error() {
        let e = find_devices(&cfg(Some("=no-such-if9"), true, None)).unwrap_err();
        assert!(e.contains("WIRESPEED_IFNAME==no-such-if9"), "{e}");
    }
}
