//! A group as the engine sees it: one set of collectives (`api::Collectives`), whatever carries
//! them; this file makes the group (`Setup`) and implements the trait for `Comm`. Ranks that all
//! share a host get the shared-memory `Comm` unchanged (its speed is the product on one host);
//! ranks spread over hosts get `HostsComm`, which uses a `Comm` per host plus TCP between hosts.
//!
//! Setup is two steps so any store can carry the rendezvous: `Setup::new` (knowing every rank's
//! host id) creates what peers need to reach this rank and returns it from `info`; the caller
//! exchanges infos through its store and hands them all to `connect`.
use crate::api::{Buf, Collectives, Ticket};
use crate::config::Config;
use crate::shm::comm::{Comm, RankInfo};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::hosts::{HostsComm, HostsSetup};
use std::time::Duration;

/// Each method hands its buffers on to `Comm`'s method of the same name, whose `# Safety` is
/// `Collectives`' buffer contract (api.rs): the one this method's caller upholds.
impl Collectives for Comm {
    fn rank(&self) -> usize {
        self.rank
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `buf` holds `count` elements until this
        // returns.
        unsafe { Comm::all_reduce(self, buf, count, dtype, op) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `send` and `out` are valid until this returns.
        unsafe { Comm::reduce_scatter(self, send, out, count, dtype, op) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `buf` holds `count` elements until this
        // returns.
        unsafe { Comm::reduce(self, buf, count, dtype, op, root) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `send` and `recv` are valid until this returns.
        unsafe { Comm::all_gather(self, send, recv) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `send` and `recv` are valid until this returns.
        unsafe { Comm::all_to_all(self, send, recv) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `buf` is valid until this returns.
        unsafe { Comm::broadcast(self, buf, root) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `send` and (on the root) `recv` are valid until
        // this returns.
        unsafe { Comm::gather(self, send, recv, root) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `recv` and (on the root) `send` are valid until
        // this returns.
        unsafe { Comm::scatter(self, send, recv, root) }
    }
    fn barrier(&mut self) -> Result<()> {
        Comm::barrier(self)
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket> {
        // SAFETY: `Collectives`' contract (api.rs): `addr..addr+len` stays valid until the ticket
        // completes; the boxed ticket is `Comm`'s own, so its completion is the same.
        unsafe { Comm::send_post(self, to, addr, len, tag).map(|t| Box::new(t) as Ticket) }
    }
    // SAFETY: unsafe to call: `Collectives`' buffer contract (api.rs) is this method's; it forwards to `Comm`'s method of the same contract
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `addr..addr+len` is writable, and ours alone,
        // until this returns.
        unsafe { Comm::recv(self, from, addr, len, tag) }
    }
    fn abort(&mut self, e: &Error) {
        self.fail(e);
    }
}

/// A rank between `new` and `connect`.
pub enum Setup {
    OneHost(Comm),
    Hosts(HostsSetup),
}

impl Setup {
    /// `hosts[r]` is rank r's host id (`Config::host_id`); `cfg` is the core's configuration,
    /// read once by the caller (`Config::from_env` in the bindings).
    pub fn new(rank: usize, world: usize, token: [u8; 16], timeout: Duration, hosts: &[String], cfg: &Config) -> Result<Setup> {
        if hosts.is_empty() || hosts.iter().all(|h| *h == hosts[0]) {
            return Ok(Setup::OneHost(Comm::new(rank, world, token, timeout, cfg)?));
        }
        Ok(Setup::Hosts(HostsSetup::new(rank, world, token, timeout, hosts, cfg)?))
    }

    pub fn info(&self) -> RankInfo {
        match self {
            Setup::OneHost(c) => c.info(),
            Setup::Hosts(h) => h.info(),
        }
    }

    pub fn connect(self, infos: &[RankInfo]) -> Result<Box<dyn Collectives>> {
        match self {
            Setup::OneHost(mut c) => {
                c.connect(infos)?;
                Ok(Box::new(c))
            }
            Setup::Hosts(h) => Ok(Box::new(h.connect(infos)?) as Box<HostsComm>),
        }
    }
}
