//! The connection handle `listen` writes and NCCL carries to the connecting rank (at most
//! NCCL_NET_HANDLE_MAXSIZE = 128 bytes), and the dialing state `connect` keeps in its own copy.
//!
//! Layout (little-endian):
//! ```text
//!   0  u32  magic "WSNH"          16  [u8;16] IP (IPv4 in the first 4 bytes)
//!   4  u8   layout version (1)    32  [u8;32] key: random per listen; the dialer sends it on
//!   5  u8   family (4 or 6)                   every stream and the listener refuses any other
//!   6  u16  port                  64  u64  dialing state (see below), 0 in what listen writes
//!   8  u16  streams to open       72  zero up to 128
//!  10  u16  zero
//!  12  u32  IPv6 scope id
//! ```
//! `connect` must not block, so NCCL calls it again with the same handle buffer until it returns a
//! comm (NCCL's own socket transport relies on this too). The first call starts a dialer and
//! stores its address at offset 64 of the caller's copy; later calls advance that dialer.
use crate::abi::NCCL_NET_HANDLE_MAXSIZE;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

const MAGIC: u32 = 0x484e_5357; // "WSNH" in memory order
const LAYOUT: u8 = 1;
pub const STAGE_OFFSET: usize = 64;
const _: () = assert!(STAGE_OFFSET + 8 <= NCCL_NET_HANDLE_MAXSIZE);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub addr: SocketAddr,
    pub nstreams: u16,
    pub key: [u8; 32],
}

impl Handle {
    pub fn encode(&self, out: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) {
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = LAYOUT;
        out[6..8].copy_from_slice(&self.addr.port().to_le_bytes());
        out[8..10].copy_from_slice(&self.nstreams.to_le_bytes());
        match self.addr {
            SocketAddr::V4(a) => {
                out[5] = 4;
                out[16..20].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                out[5] = 6;
                out[12..16].copy_from_slice(&a.scope_id().to_le_bytes());
                out[16..32].copy_from_slice(&a.ip().octets());
            }
        }
        out[32..64].copy_from_slice(&self.key);
    }

    pub fn decode(b: &[u8; NCCL_NET_HANDLE_MAXSIZE]) -> Result<Handle, String> {
        if u32::from_le_bytes(b[0..4].try_into().unwrap()) != MAGIC || b[4] != LAYOUT {
            return Err("the connection handle is not a wirespeed handle of this version (are all ranks using the same plugin build?)".into());
        }
        let port = u16::from_le_bytes([b[6], b[7]]);
        let nstreams = u16::from_le_bytes([b[8], b[9]]);
        let ip = match b[5] {
            4 => IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])),
            6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[16..32]).unwrap())),
            f => return Err(format!("the connection handle names address family {f}")),
        };
        let addr = match ip {
            IpAddr::V4(_) => SocketAddr::new(ip, port),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, u32::from_le_bytes(b[12..16].try_into().unwrap()))),
        };
        if port == 0 || nstreams == 0 {
            return Err("the connection handle has no port or no streams".into());
        }
        Ok(Handle { addr, nstreams, key: b[32..64].try_into().unwrap() })
    }
}

pub fn stage(b: &[u8; NCCL_NET_HANDLE_MAXSIZE]) -> u64 {
    u64::from_le_bytes(b[STAGE_OFFSET..STAGE_OFFSET + 8].try_into().unwrap())
}

pub fn set_stage(b: &mut [u8; NCCL_NET_HANDLE_MAXSIZE], v: u64) {
    b[STAGE_OFFSET..STAGE_OFFSET + 8].copy_from_slice(&v.to_le_bytes());
}

/// 32 random bytes from the kernel, for a listen key.
pub fn random_key() -> Result<[u8; 32], String> {
    let mut k = [0u8; 32];
    wirespeed_core::net::random_bytes(&mut k).map_err(|e| e.to_string())?;
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_v4_and_v6_and_stage_is_separate() {
        for addr in ["10.1.2.3:4567", "[fe80::1%3]:9", "[2001:db8::7]:65535"] {
            let addr: SocketAddr = match addr.parse() {
                Ok(a) => a,
                // "%scope" is not parsed by std: build it by hand.
                Err(_) => SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 9, 0, 3)),
            };
            let h = Handle { addr, nstreams: 8, key: random_key().unwrap() };
            let mut b = [0xAAu8; NCCL_NET_HANDLE_MAXSIZE];
            h.encode(&mut b);
            assert_eq!(stage(&b), 0);
            set_stage(&mut b, 0xdead_beef);
            assert_eq!(Handle::decode(&b).unwrap(), h);
            assert!(b[72..].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn foreign_bytes_are_refused() {
        let b = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        assert!(Handle::decode(&b).unwrap_err().contains("not a wirespeed handle"));
    }

    #[test]
    fn keys_differ() {
        assert_ne!(random_key().unwrap(), random_key().unwrap());
    }
}
