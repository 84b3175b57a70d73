//! Which local address the TCP transport listens on, so peers on other hosts reach it over the
//! network the user meant (a host often has several: loopback, docker bridges, a management NIC
//! and the fast one).
//!
//! Order: `WIRESPEED_IFNAME`, then the conventions users already set for gloo and NCCL
//! (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`), then the address this host would use to reach
//! `MASTER_ADDR` (the rendezvous host is reachable by every rank, so the route to it is the one
//! the job's network uses), then the address the hostname resolves to.
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

/// The address to listen on and how it was chosen (for error messages and `wirespeed env`).
pub fn listen_ip() -> Result<(IpAddr, String)> {
    for var in ["WIRESPEED_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"] {
        let Ok(v) = std::env::var(var) else { continue };
        // NCCL's syntax allows a list, "=name" (exact) and "^name" (exclude): take the first
        // included name; an exclusion list names no interface, so fall through to the route.
        let Some(name) = v.split(',').map(|s| s.trim().trim_start_matches('=')).find(|s| !s.is_empty() && !s.starts_with('^'))
        else {
            continue;
        };
        return match iface_addr(name) {
            Some(ip) => Ok((ip, format!("{var}={name}"))),
            None => Err(Error::Unsupported(format!(
                "{var}={v:?}: no interface {name:?} with an IP address on this host (see `ip addr`)"
            ))),
        };
    }
    if let Ok(master) = std::env::var("MASTER_ADDR") {
        let port: u16 = std::env::var("MASTER_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(29500);
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

/// The first IPv4 address of interface `name` (else its first IPv6 one).
pub fn iface_addr(name: &str) -> Option<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs's list stays valid until freeifaddrs below; each entry's name and (non-null) address point into it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut v4 = None;
    let mut v6 = None;
    let mut p = head;
    while !p.is_null() {
        // SAFETY: getifaddrs's list stays valid until freeifaddrs below; each entry's name and (non-null) address point into it.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: getifaddrs's list stays valid until freeifaddrs below; each entry's name and (non-null) address point into it.
        let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if n != name {
            continue;
        }
        // SAFETY: getifaddrs's list stays valid until freeifaddrs below; each entry's name and (non-null) address point into it.
        match unsafe { (*ifa.ifa_addr).sa_family } as i32 {
            libc::AF_INET if v4.is_none() => {
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                v4 = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
            }
            libc::AF_INET6 if v6.is_none() => {
                // SAFETY: getifaddrs's list stays valid until freeifaddrs below; each entry's name and (non-null) address point into it.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                v6 = Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    // SAFETY: getifaddrs's list stays valid until freeifaddrs below; each entry's name and (non-null) address point into it.
    unsafe { libc::freeifaddrs(head) };
    v4.or(v6)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_has_an_address_and_unknown_names_none() {
        assert_eq!(super::iface_addr("lo"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(super::iface_addr("no-such-if0"), None);
    }
}
