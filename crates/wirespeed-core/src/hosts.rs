//! A group whose ranks live on several hosts: ranks are grouped by host id; the ranks of one host
//! form a shared-memory `Comm` (its own local numbering), and every pair of ranks on different
//! hosts is joined by TCP (tcp.rs). Point-to-point goes over whichever of the two joins a pair.
//!
//! Collectives across hosts:
//! - all_reduce: hierarchical (shm reduce to each host's leader, ring or recursive doubling among
//!   leaders over TCP, shm broadcast from the leader; hier.rs), or a flat ring over all ranks with
//!   WIRESPEED_ALGO=ring (ring.rs).
//! - broadcast: the root sends once to one rank per other host, then each host broadcasts in shm,
//!   so the payload crosses each host's link once.
//! - the rest: direct exchanges (every rank sends what each peer needs, in pieces, and reduces
//!   what it receives in rank order). Correct for any placement; each byte crosses a link once.
//!
//! Every message of a collective carries a tag made of the collective, dtype, op, root and a
//! sequence number, so ranks that call different collectives (or the same one with a different
//! dtype, op or root) get a `Mismatch` on the receiving side instead of mixed data; sizes are
//! checked by every receive. Such an error is seen by the receiver only, so any error breaks the
//! group: the local segment says why (local peers raise at once) and the TCP connections are shut
//! (remote peers raise at once).
use crate::plan::{AllReduceAlgo, Tuning};
use crate::collectives::{check_list, check_rank, Buf, ALL_GATHER, ALL_TO_ALL, BARRIER, BROADCAST, GATHER, REDUCE, REDUCE_SCATTER, SCATTER};
use crate::comm::{Comm, RankInfo};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::p2p::Ticket;
use crate::reduce::reduce_many;
use crate::sys;
use crate::tcp::{Config, Listener, Tcp};
use std::time::Duration;

/// Ranks grouped by host, hosts ordered by their lowest rank (so every rank computes the same).
pub struct Layout {
    pub hosts: Vec<Vec<usize>>,
    pub host_of: Vec<usize>,
    pub local_of: Vec<usize>,
}

impl Layout {
    pub fn new(ids: &[String]) -> Layout {
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut names: Vec<&String> = Vec::new();
        let mut host_of = vec![0; ids.len()];
        let mut local_of = vec![0; ids.len()];
        for (r, id) in ids.iter().enumerate() {
            let h = match names.iter().position(|n| *n == id) {
                Some(h) => h,
                None => {
                    names.push(id);
                    hosts.push(Vec::new());
                    hosts.len() - 1
                }
            };
            host_of[r] = h;
            local_of[r] = hosts[h].len();
            hosts[h].push(r);
        }
        Layout { hosts, host_of, local_of }
    }
}

/// A rank of a multi-host group between `new` and `connect`.
pub struct HostsSetup {
    rank: usize,
    world: usize,
    token: [u8; 16],
    timeout: Duration,
    lay: Layout,
    local: Comm,
    listener: Listener,
    cfg: Config,
}

impl HostsSetup {
    pub fn new(rank: usize, world: usize, token: [u8; 16], timeout: Duration, ids: &[String]) -> Result<HostsSetup> {
        if ids.len() != world || rank >= world {
            return Err(Error::Unsupported(format!("{} host ids for rank {rank} of a world of {world}", ids.len())));
        }
        let lay = Layout::new(ids);
        let h = lay.host_of[rank];
        let local = Comm::new(lay.local_of[rank], lay.hosts[h].len(), token, timeout)?;
        let cfg = Config::from_env()?;
        let (ip, _how) = crate::iface::listen_ip()?;
        // Lower ranks on other hosts dial this one (tcp.rs): those are the connections to expect.
        let dialers: Vec<usize> = (0..rank).filter(|&r| lay.host_of[r] != h).collect();
        let listener = Listener::bind(ip, rank, world, token, cfg, &dialers)?;
        Ok(HostsSetup { rank, world, token, timeout, lay, local, listener, cfg })
    }

    pub fn info(&self) -> RankInfo {
        let mut i = self.local.info();
        i.addr = self.listener.addr.to_string();
        i
    }

    pub fn connect(self, infos: &[RankInfo]) -> Result<HostsComm> {
        let HostsSetup { rank, world, token, timeout, lay, mut local, listener, cfg } = self;
        if infos.len() != world {
            return Err(Error::Mismatch(format!("{} rank infos for a world of {world}", infos.len())));
        }
        let h = lay.host_of[rank];
        let local_infos: Vec<RankInfo> = lay.hosts[h].iter().map(|&r| infos[r].clone()).collect();
        local.connect(&local_infos)?;
        let addrs: Vec<String> = infos.iter().map(|i| i.addr.clone()).collect();
        let remote: Vec<bool> = (0..world).map(|r| lay.host_of[r] != h).collect();
        let tcp = Tcp::connect(listener, rank, &addrs, &remote, token, cfg, timeout)?;
        let tuning = Tuning::from_env()?;
        Ok(HostsComm { rank, world, lay, local, tcp, seq: 0, broken: None, tuning, scratch: Vec::new() })
    }
}

pub struct HostsComm {
    pub rank: usize,
    pub world: usize,
    pub(crate) lay: Layout,
    pub(crate) local: Comm,
    pub(crate) tcp: Tcp,
    seq: u64,
    broken: Option<Error>,
    pub(crate) tuning: Tuning,
    scratch: Vec<u8>,
}

/// Bytes per message of a piecewise exchange: the receiver reduces piece k while k+1.. travel.
pub(crate) const PIECE: usize = 4 << 20;

pub(crate) fn pieces(len: usize, esize: usize) -> Vec<(usize, usize)> {
    let per = (PIECE / esize).max(1) * esize;
    let n = len.div_ceil(per).max(1);
    (0..n).map(|i| (i * per, per.min(len - (i * per).min(len)))).collect()
}

impl HostsComm {
    pub fn hosts(&self) -> &[Vec<usize>] {
        &self.lay.hosts
    }
    /// Choose the cross-host all_reduce algorithm as WIRESPEED_ALGO does (`Ring`, `Hier` or
    /// `Doubling`; any other value lets the cost model choose). Every rank must choose the same.
    pub fn force_all_reduce(&mut self, algo: crate::plan::AllReduceAlgo) {
        self.tuning.all_reduce = algo;
    }

    /// Connections refused so far by this rank's listener.
    pub fn refused(&self) -> usize {
        self.tcp.refused()
    }
    pub(crate) fn my_host(&self) -> usize {
        self.lay.host_of[self.rank]
    }
    pub(crate) fn is_leader(&self) -> bool {
        self.lay.local_of[self.rank] == 0
    }

    pub(crate) fn tag(&mut self, kind: u32, dtype: Option<DType>, op: Option<ReduceOp>, root: usize) -> u64 {
        self.seq += 1;
        let d = dtype.map(|d| d as u64).unwrap_or(0xff) & 0xff;
        let o = op.map(|o| o as u64).unwrap_or(0xff) & 0xff;
        (1 << 63) | ((kind as u64 & 0x7f) << 56) | (d << 48) | (o << 40) | ((root as u64 & 0xff) << 32) | (self.seq & 0xffff_ffff)
    }

    pub(crate) fn scratch(&mut self, n: usize) -> usize {
        if self.scratch.len() < n {
            self.scratch = vec![0u8; n.next_power_of_two()];
        }
        self.scratch.as_mut_ptr() as usize
    }

    /// Send to any rank: shared memory inside the host, TCP across.
    pub(crate) fn post(&mut self, to: usize, b: Buf, tag: u64) -> Result<Ticket> {
        if self.lay.host_of[to] == self.my_host() {
            self.local.send_post(self.lay.local_of[to], b.0, b.1, tag).map(Ticket::Shm)
        } else {
            self.tcp.send(to, b.0 as *const u8, b.1, tag).map(Ticket::Tcp)
        }
    }

    pub(crate) fn take(&mut self, from: usize, b: Buf, tag: u64) -> Result<()> {
        if self.lay.host_of[from] == self.my_host() {
            self.local.recv(self.lay.local_of[from], b.0, b.1, tag)
        } else {
            self.tcp.recv(from, b.0 as *mut u8, b.1, tag)
        }
    }

    /// Run an op; any error breaks the group and tells every peer (see the module comment).
    pub(crate) fn guarded(&mut self, f: impl FnOnce(&mut HostsComm) -> Result<()>) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        let r = f(self);
        if let Err(e) = &r {
            self.broken = Some(e.clone());
            self.local.fail(e);
            self.tcp.shutdown();
        }
        r
    }

    /// recv[j] = what rank j sends to this rank; send[j] goes to rank j. Sends are posted first
    /// (they never block on the receiver), then receives run from the nearest rank outward.
    fn exchange(&mut self, tag: u64, send: &[Buf], recv: &[Buf]) -> Result<()> {
        let me = self.rank;
        let mut tickets = Vec::new();
        for k in 1..self.world {
            let j = (me + k) % self.world;
            if let Some(&b) = send.get(j) {
                tickets.push(self.post(j, b, tag)?);
            }
        }
        if let (Some(&s), Some(&r)) = (send.get(me), recv.get(me)) {
            if s.1 != r.1 {
                return Err(Error::Mismatch(format!("rank {me} sends {} bytes to itself but receives {}", s.1, r.1)));
            }
            if s.0 != r.0 && s.1 > 0 {
                unsafe { sys::copy(r.0 as *mut u8, s.0 as *const u8, s.1) };
            }
        }
        for k in 1..self.world {
            let j = (me + self.world - k) % self.world;
            if let Some(&b) = recv.get(j) {
                self.take(j, b, tag)?;
            }
        }
        tickets.iter().try_for_each(|t| t.wait())
    }

    /// out = op over ranks j (in rank order) of what j sends to this rank; `send[j]` goes to j
    /// (to `root` only, if given: then only the root passes `out`).
    /// Piece by piece: post piece k to everyone, then receive and reduce piece k from everyone.
    #[allow(clippy::too_many_arguments)]
    fn reduce_direct(&mut self, tag: u64, send: &[Buf], root: Option<usize>, out: Option<usize>, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let (me, world, es) = (self.rank, self.world, dtype.size());
        let bytes = count * es;
        for (j, b) in send.iter().enumerate() {
            if b.1 != 0 && b.1 != bytes {
                return Err(Error::Mismatch(format!("rank {me} contributes {} bytes to rank {j}, expected {bytes}", b.1)));
            }
        }
        let ps = pieces(bytes, es);
        let scratch = if out.is_some() { self.scratch(PIECE * world) } else { 0 };
        let mut tickets = Vec::new();
        for &(off, n) in &ps {
            for k in 1..world {
                let j = (me + k) % world;
                if root.is_none_or(|r| r == j) {
                    tickets.push(self.post(j, (send[j].0 + off, n), tag)?);
                }
            }
            let Some(out) = out else { continue };
            let mut srcs = Vec::with_capacity(world);
            for j in 0..world {
                if j == me {
                    srcs.push((send[me].0 + off) as *const u8);
                } else {
                    let dst = scratch + j * PIECE;
                    self.take(j, (dst, n), tag)?;
                    srcs.push(dst as *const u8);
                }
            }
            unsafe { reduce_many((out + off) as *mut u8, &srcs, n / es, dtype, op, world) };
        }
        tickets.iter().try_for_each(|t| t.wait())
    }

    fn all_reduce_impl(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let algo = self.tuning.pick_across_hosts(count * dtype.size(), self.world, self.lay.hosts.len());
        let tag = self.tag(crate::collectives::ALL_REDUCE, Some(dtype), Some(op), algo as usize);
        match algo {
            AllReduceAlgo::Ring => {
                let members: Vec<usize> = (0..self.world).collect();
                self.ring_all_reduce(tag, &members, buf, count, dtype, op)
            }
            _ => self.hier_all_reduce(tag, buf, count, dtype, op),
        }
    }

    fn broadcast_impl(&mut self, buf: Buf, root: usize) -> Result<()> {
        let tag = self.tag(BROADCAST, None, None, root);
        let (me, rh) = (self.rank, self.lay.host_of[root]);
        // One rank per other host receives from the root: its leader.
        let mut tickets = Vec::new();
        if me == root {
            for h in 0..self.lay.hosts.len() {
                if h != rh {
                    let to = self.lay.hosts[h][0];
                    tickets.push(self.post(to, buf, tag)?);
                }
            }
        } else if self.my_host() != rh && self.is_leader() {
            self.take(root, buf, tag)?;
        }
        let src = if self.my_host() == rh { self.lay.local_of[root] } else { 0 };
        if self.lay.hosts[self.my_host()].len() > 1 {
            self.local.broadcast(buf, src)?;
        }
        tickets.iter().try_for_each(|t| t.wait())
    }
}

impl crate::group::Collectives for HostsComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        self.guarded(|c| c.all_reduce_impl(buf, count, dtype, op))
    }
    fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        check_list(self.world, send.len(), "reduce_scatter inputs")?;
        self.guarded(|c| {
            let tag = c.tag(REDUCE_SCATTER, Some(dtype), Some(op), 0);
            c.reduce_direct(tag, send, None, Some(out), count, dtype, op)
        })
    }
    fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        self.guarded(|c| {
            let tag = c.tag(REDUCE, Some(dtype), Some(op), root);
            let mut send = vec![(0usize, 0usize); c.world];
            send[root] = (buf, count * dtype.size());
            let out = (c.rank == root).then_some(buf);
            c.reduce_direct(tag, &send, Some(root), out, count, dtype, op)
        })
    }
    fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()> {
        check_list(self.world, recv.len(), "all_gather outputs")?;
        self.guarded(|c| {
            let tag = c.tag(ALL_GATHER, None, None, 0);
            c.exchange(tag, &vec![send; c.world], recv)
        })
    }
    fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()> {
        check_list(self.world, send.len(), "all_to_all inputs")?;
        check_list(self.world, recv.len(), "all_to_all outputs")?;
        self.guarded(|c| {
            let tag = c.tag(ALL_TO_ALL, None, None, 0);
            c.exchange(tag, send, recv)
        })
    }
    fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        self.guarded(|c| c.broadcast_impl(buf, root))
    }
    fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        if self.rank == root {
            check_list(self.world, recv.len(), "gather outputs on the root")?;
        }
        self.guarded(|c| {
            let tag = c.tag(GATHER, None, None, root);
            if c.rank != root {
                return c.post(root, send, tag)?.wait();
            }
            for (j, &r) in recv.iter().enumerate() {
                if j != root {
                    c.take(j, r, tag)?;
                } else if send.1 != r.1 {
                    return Err(Error::Mismatch(format!("gather: the root sends {} bytes but expects {} from itself", send.1, r.1)));
                } else if send.0 != r.0 && send.1 > 0 {
                    unsafe { sys::copy(r.0 as *mut u8, send.0 as *const u8, send.1) };
                }
            }
            Ok(())
        })
    }
    fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        if self.rank == root {
            check_list(self.world, send.len(), "scatter inputs on the root")?;
        }
        self.guarded(|c| {
            let tag = c.tag(SCATTER, None, None, root);
            if c.rank != root {
                return c.take(root, recv, tag);
            }
            let mut tickets = Vec::new();
            for (j, &s) in send.iter().enumerate() {
                if j != root {
                    tickets.push(c.post(j, s, tag)?);
                } else {
                    if s.1 != recv.1 {
                        return Err(Error::Mismatch(format!("scatter: root sends {} bytes to itself but receives {}", s.1, recv.1)));
                    }
                    if s.0 != recv.0 && s.1 > 0 {
                        unsafe { sys::copy(recv.0 as *mut u8, s.0 as *const u8, s.1) };
                    }
                }
            }
            tickets.iter().try_for_each(|t| t.wait())
        })
    }
    fn barrier(&mut self) -> Result<()> {
        self.guarded(|c| {
            let tag = c.tag(BARRIER, None, None, 0);
            let none = vec![(0usize, 0usize); c.world];
            c.exchange(tag, &none, &none)
        })
    }
    fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket> {
        check_rank(self.world, to, "send to")?;
        if to == self.rank {
            return Err(Error::Unsupported(format!("rank {to} cannot send to itself")));
        }
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        let r = self.post(to, (addr, len), tag);
        if let Err(e) = &r {
            self.broken = Some(e.clone());
            self.local.fail(e);
            self.tcp.shutdown();
        }
        r
    }
    fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()> {
        check_rank(self.world, from, "receive from")?;
        if from == self.rank {
            return Err(Error::Unsupported(format!("rank {from} cannot receive from itself")));
        }
        self.guarded(|c| c.take(from, (addr, len), tag))
    }
}
