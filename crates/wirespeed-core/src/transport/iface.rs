//! Network interfaces: which ones a user selected, and which local address to listen on, so
//! peers on other hosts reach this rank over the network the user meant (a host often has
//! several: loopback, docker bridges, a management NIC and the fast one). One parser and one
//! enumeration serve the groups (`listen_ip`) and the NCCL plugin (its devices), so a selection
//! means the same to both.
//!
//! Selection syntax (NCCL's, for `WIRESPEED_IFNAME` and `NCCL_SOCKET_IFNAME`): a comma list of
//! name prefixes (`eth` selects eth0 and eth1); `=` before the list for exact names; `^` before
//! it (and before any `=`) for an exclusion list. `GLOO_SOCKET_IFNAME` is gloo's: exact names.
//!
//! The groups' order: `WIRESPEED_IFNAME`, then the variables users already set for gloo and NCCL
//! (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`), then the address this host would use to reach
//! `MASTER_ADDR` (the rendezvous host is reachable by every rank, so the route to it is the one
//! the job's network uses), then the address the hostname resolves to.
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

/// An interface selection (see the module's note for the syntax).
#[derive(Debug, PartialEq)]
pub struct IfSpec {
    pub exclude: bool,
    pub exact: bool,
    pub names: Vec<String>,
}

impl IfSpec {
    /// NCCL's syntax.
    pub fn parse(s: &str) -> IfSpec {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        IfSpec { exclude, exact, names }
    }

    /// A selection in the syntax of the variable it came from: gloo's takes exact names.
    pub fn from_var(var: &str, value: &str) -> IfSpec {
        if var == "GLOO_SOCKET_IFNAME" {
            let names = value.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
            return IfSpec { exclude: false, exact: true, names };
        }
        IfSpec::parse(value)
    }

    fn listed(&self, name: &str) -> bool {
        self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) })
    }

    pub fn selects(&self, name: &str) -> bool {
        self.listed(name) != self.exclude
    }
}

/// An address family to keep to (`WIRESPEED_SOCKET_FAMILY` / `NCCL_SOCKET_FAMILY` in the plugin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// One network interface of this host, with its addresses in the kernel's order.
pub struct Iface {
    pub name: String,
    pub index: u32,
    pub up: bool,
    pub loopback: bool,
    pub v4: Vec<Ipv4Addr>,
    pub v6: Vec<Ipv6Addr>,
}

impl Iface {
    /// The address to listen on: IPv4 first unless a family is asked for; a global IPv6 address
    /// before a link-local one, which needs its scope (the interface index, returned with it).
    pub fn pick_addr(&self, family: Option<Family>) -> Option<(IpAddr, u32)> {
        let v4 = self.v4.first().map(|a| (IpAddr::V4(*a), 0));
        let v6 = self.v6.iter().find(|a| !is_link_local(a)).map(|a| (IpAddr::V6(*a), 0))
            .or_else(|| self.v6.first().map(|a| (IpAddr::V6(*a), self.index)));
        match family {
            Some(Family::V4) => v4,
            Some(Family::V6) => v6,
            None => v4.or(v6),
        }
    }
}

fn is_link_local(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}

/// This host's interfaces, in the kernel's order.
pub fn interfaces() -> Vec<Iface> {
    let mut out: Vec<Iface> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a local out-pointer; on success getifaddrs points it at a list that stays
    // valid until the freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a non-null node of that list, alive until the freeifaddrs below.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let i = match out.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                let cname = std::ffi::CString::new(name.clone()).unwrap_or_default();
                // SAFETY: a valid C string.
                let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
                out.push(Iface { name, index, up: false, loopback: false, v4: vec![], v6: vec![] });
                out.len() - 1
            }
        };
        let f = &mut out[i];
        f.up |= ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        f.loopback |= ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr whose family says which struct it is.
        match unsafe { (*ifa.ifa_addr).sa_family } as i32 {
            libc::AF_INET => {
                // SAFETY: AF_INET: a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                f.v4.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6: a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                f.v6.push(Ipv6Addr::from(sin6.sin6_addr.s6_addr));
            }
            _ => {}
        }
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The variables that select the groups' interface, in the order they are looked at.
pub const IFNAME_VARS: [&str; 3] = ["WIRESPEED_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"];

/// The address to listen on and how it was chosen (for error messages and `wirespeed env`);
/// `var` gives the variables named above as they were read (`config::Config::listen_var`).
pub fn listen_ip(var: &dyn Fn(&str) -> Option<String>) -> Result<(IpAddr, String)> {
    listen_ip_from(var, &interfaces())
}

/// `listen_ip` over given variables and interfaces. A selection takes the first interface it
/// selects that is up and has an address; an exclusion list passes over loopback too (as NCCL's
/// default does), while a name list may pick it (one-machine tests).
pub fn listen_ip_from(var: &dyn Fn(&str) -> Option<String>, ifaces: &[Iface]) -> Result<(IpAddr, String)> {
    for name in IFNAME_VARS {
        let Some(v) = var(name).filter(|v| !v.trim().is_empty()) else { continue };
        let spec = IfSpec::from_var(name, &v);
        let chosen = ifaces.iter().filter(|f| f.up && spec.selects(&f.name) && !(spec.exclude && f.loopback))
            .find_map(|f| f.pick_addr(None).map(|(ip, _)| (ip, &f.name)));
        return match chosen {
            Some((ip, f)) => Ok((ip, format!("{name}={v} ({f})"))),
            None => Err(Error::Unsupported(format!(
                "{name}={v:?} selects no interface that is up with an IP address on this host (see `ip addr`)"
            ))),
        };
    }
    if let Some(master) = var("MASTER_ADDR") {
        let port: u16 = var("MASTER_PORT").and_then(|p| p.parse().ok()).unwrap_or(29500);
        if let Some(ip) = route_to(&master, port) {
            return Ok((ip, format!("the route to MASTER_ADDR={master}")));
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    if let Some(a) = (host.trim(), 0u16).to_socket_addrs().ok().and_then(|mut it| it.next()) {
        return Ok((a.ip(), format!("the hostname {}", host.trim())));
    }
    Ok((IpAddr::V4(Ipv4Addr::LOCALHOST), "loopback (no interface, MASTER_ADDR or hostname address)".into()))
}

/// The source address the kernel picks for a datagram to `host` (no packet is sent).
fn route_to(host: &str, port: u16) -> Option<IpAddr> {
    let dest: SocketAddr = (host, port).to_socket_addrs().ok()?.next()?;
    let bind: SocketAddr = if dest.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(dest).ok()?;
    Some(s.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_interface_syntax() {
        let s = IfSpec::parse("^docker,lo");
        assert!(s.exclude && !s.exact);
        assert!(!s.selects("docker0") && !s.selects("lo") && s.selects("eth0"));
        let s = IfSpec::parse("=eth0,ib");
        assert!(s.exact && s.selects("eth0") && !s.selects("eth01") && !s.selects("ib0"));
        let s = IfSpec::parse("eth");
        assert!(s.selects("eth1") && !s.selects("veth1"));
        assert!(!IfSpec::parse("^=lo").selects("lo") && IfSpec::parse("^=lo").selects("lo0"));
        // gloo's variable names exact interfaces
        assert!(!IfSpec::from_var("GLOO_SOCKET_IFNAME", "eth").selects("eth0"));
        assert!(IfSpec::from_var("GLOO_SOCKET_IFNAME", "eth0").selects("eth0"));
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_groups_read_a_selection_as_the_plugin_does() {
        let ifs = interfaces();
        let lo = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        // a prefix, as NCCL_SOCKET_IFNAME=eth selects eth0 (it was refused before: no interface "l")
        let (ip, how) = listen_ip_from(&vars(&[("NCCL_SOCKET_IFNAME", "l")]), &ifs).unwrap();
        assert_eq!((Some(ip), how.contains("(lo)")), (lo, true), "{how}");
        assert_eq!(listen_ip_from(&vars(&[("WIRESPEED_IFNAME", "=lo")]), &ifs).unwrap().0, lo.unwrap());
        let e = listen_ip_from(&vars(&[("NCCL_SOCKET_IFNAME", "=no-such-if9")]), &ifs).unwrap_err();
        assert!(e.to_string().contains("selects no interface"), "{e}");
        // an exclusion list never lands on loopback
        if let Ok((ip, _)) = listen_ip_from(&vars(&[("NCCL_SOCKET_IFNAME", "^docker")]), &ifs) {
            assert!(!ip.is_loopback(), "{ip}");
        }
    }
}
