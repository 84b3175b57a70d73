//! The multi-host group (`Group`) and its setup (`Setup`): the collectives, each run inside
//! `guarded` over the group's `Route`; mod.rs says how each collective crosses hosts.
use crate::config::Config;
use crate::plan::{NetAlgo, Tuning};
use crate::api::{check_list, check_rank, Buf, Collectives, Kind, Ticket};
use crate::api::RankInfo;
use crate::shm::comm::Comm;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use super::mesh::{Connect, MeshListener, Mesh};
use super::route::Route;
use super::layout::HostLayout;
use super::{fds, hier, probe};
use crate::algo::direct::Region;
use crate::transport::Transport;
use std::time::Duration;


/// A rank of a multi-host group between `new` and `connect`.
pub struct Setup {
    rank: usize,
    world: usize,
    token: [u8; 16],
    timeout: Duration,
    lay: HostLayout,
    local: Comm,
    listener: MeshListener,
    /// TCP streams to each rank (`HostLayout::pair_streams`; 0 on this host).
    streams: Vec<usize>,
    /// The planner's knobs (`Config::tuning`), for the connected group.
    tuning: Tuning,
    /// Streams opened to each bandwidth peer, and whether WIRESPEED_NSTREAMS set them (no
    /// probe; probe.rs).
    nstreams: usize,
    forced: bool,
}

impl Setup {
    /// `ids[r]` is rank r's host id; `cfg` gives the planner's and the TCP engine's knobs and the
    /// variables that choose the listening address. `rooms[r]` is rank r's open-file room
    /// (`fds::FdRoom`, exchanged with the host ids): every rank then agrees on the streams per
    /// pair that every rank's limit holds, raising its own soft limit where needed, or fails
    /// alike (fds.rs). Empty: WIRESPEED_NSTREAMS as it is, the limits unchecked (tests).
    pub fn new(rank: usize, world: usize, token: [u8; 16], timeout: Duration, ids: &[String], rooms: &[fds::FdRoom], cfg: &Config) -> Result<Setup> {
        if ids.len() != world || rank >= world {
            return Err(Error::Unsupported(format!("{} host ids for rank {rank} of a world of {world}", ids.len())));
        }
        let lay = HostLayout::new(ids);
        // Before anything is opened: the stream count every rank uses, or every rank's error.
        // A rank whose own TCP knobs are invalid says so first; the others fail on the
        // disagreement its room shows (it publishes 0 streams).
        let mut net = cfg.net.clone()?;
        let planned = if rooms.is_empty() { None } else { Some(fds::plan(&lay, rooms)?) };
        if let Some(p) = &planned {
            fds::apply(p, rank, rooms)?;
            net.nstreams = p.nstreams;
        }
        if rank == 0 {
            if let Some(line) = crate::sys::somaxconn().and_then(|cap| fds::backlog_line(&lay, net.nstreams, cap)) {
                eprintln!("{line}");
            }
        }
        let h = lay.host_of[rank];
        let mut local = Comm::new(lay.local_of[rank], lay.hosts[h].len(), token, timeout, cfg)?;
        local.name_members(lay.hosts[h].clone())?;
        let (ip, _how) = crate::transport::iface::listen_ip(&|v| cfg.listen_var(v))?;
        // Lower ranks on other hosts dial this one (mesh.rs): those are the connections to expect.
        let dialers: Vec<usize> = (0..rank).filter(|&r| lay.host_of[r] != h).collect();
        let streams: Vec<usize> = (0..world).map(|r| lay.pair_streams(rank, r, net.nstreams)).collect();
        let mode = if cfg.lazy_connect.clone()? { Connect::Lazy } else { Connect::Eager };
        let listener = MeshListener::bind(ip, rank, world, token, net, &dialers, &streams, mode)?;
        Ok(Setup { rank, world, token, timeout, lay, local, listener, streams, tuning: cfg.tuning, nstreams: net.nstreams, forced: cfg.nstreams_set })
    }

    pub fn info(&self) -> RankInfo {
        let mut i = self.local.info();
        i.addr = self.listener.addr.to_string();
        i
    }

    pub fn connect(self, infos: &[RankInfo]) -> Result<Group> {
        let Setup { rank, world, token, timeout, lay, mut local, listener, streams, tuning, nstreams, forced } = self;
        if infos.len() != world {
            return Err(Error::Mismatch(format!("{} rank infos for a world of {world}", infos.len())));
        }
        let h = lay.host_of[rank];
        let local_infos: Vec<RankInfo> = lay.hosts[h].iter().map(|&r| infos[r].clone()).collect();
        local.connect(&local_infos)?;
        let addrs: Vec<String> = infos.iter().map(|i| i.addr.clone()).collect();
        let mesh = Mesh::connect(listener, rank, &addrs, &streams, token, timeout)?;
        let route = Route::new(rank, world, lay, local, mesh);
        let mut comm = Group { rank, world, route, seq: 0, broken: None, tuning, scratch: Vec::new(), streams: probe::StreamChoice::default() };
        comm.streams = comm.choose_streams(nstreams, forced)?;
        Ok(comm)
    }
}

pub struct Group {
    pub rank: usize,
    pub world: usize,
    /// What the algorithms run over (route.rs).
    route: Route,
    seq: u64,
    broken: Option<Error>,
    tuning: Tuning,
    scratch: Vec<u8>,
    /// The streams each rank sends on, chosen at setup (probe.rs).
    streams: probe::StreamChoice,
}

/// all_gather's and reduce_scatter's algorithms (`Group::gather_algo`), numbered as their tags'
/// root field carries them; gather's and scatter's (`Group::rooted_algo`: direct or leaders),
/// which their tags' op field carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gather {
    Direct = 0,
    Ring = 1,
    Leaders = 2,
}

/// The tag of every message of one collective call: kind, dtype, op, root and a sequence number,
/// so ranks that called different collectives meet a Mismatch instead of mixing data.
fn op_tag(seq: u64, kind: Kind, dtype: Option<DType>, op: Option<ReduceOp>, root: usize) -> u64 {
    let d = dtype.map(|d| d as u64).unwrap_or(0xff) & 0xff;
    let o = op.map(|o| o as u64).unwrap_or(0xff) & 0xff;
    // Roots up to 2^24 ranks: the tag keeps the root's low 24 bits, the sequence number 24.
    (1 << 63) | ((kind.code() as u64 & 0x7f) << 56) | (d << 48) | (o << 40) | ((root as u64 & 0xff_ffff) << 16) | (seq & 0xffff)
}

impl Group {
    pub fn hosts(&self) -> &[Vec<usize>] {
        &self.route.lay.hosts
    }
    /// Choose the cross-host all_reduce algorithm as WIRESPEED_ALGO=ring, hier or doubling does
    /// (`Tuning::net_all_reduce`); None lets the cost model choose, as auto does. Every rank must
    /// choose the same.
    pub fn force_all_reduce(&mut self, algo: Option<NetAlgo>) {
        self.tuning.net_all_reduce = algo;
    }

    /// Connections refused so far by this rank's listener.
    pub fn refused(&self) -> usize {
        self.route.mesh.refused()
    }

    /// TCP streams of the connection with rank `r` (0 for a rank on this host, and with lazy
    /// connections for a rank not used yet).
    pub fn streams_to(&self, r: usize) -> usize {
        self.route.mesh.streams_to(r)
    }

    /// Of those, the streams this rank sends on (probe.rs).
    pub fn active_to(&self, r: usize) -> usize {
        self.route.mesh.active_to(r)
    }

    /// The stream count chosen at setup and how (the same on every rank).
    pub fn stream_choice(&self) -> &probe::StreamChoice {
        &self.streams
    }

    /// Remote ranks this rank holds streams with (with lazy connections: those used so far).
    pub fn connected(&self) -> Vec<usize> {
        self.route.mesh.connected()
    }
    fn tag(&mut self, kind: Kind, dtype: Option<DType>, op: Option<ReduceOp>, root: usize) -> u64 {
        self.seq += 1;
        op_tag(self.seq, kind, dtype, op, root)
    }

    /// Run an op; any error breaks the group and tells every peer (see the module comment). So
    /// does a panic (a bug): caught here, so that its transfers are stopped like a failed op's
    /// before anything above may free their buffers.
    fn guarded(&mut self, f: impl FnOnce(&mut Group) -> Result<()>) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        self.route.forget_pending();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))).unwrap_or_else(|p| Err(Error::from_panic(p)));
        if let Err(e) = &r {
            self.break_group(e);
        }
        self.route.forget_pending();
        r
    }

    /// Mark the group broken and tell every peer: the local segment says why, and shutting the
    /// connections also stops every transfer into or out of a caller's buffer left posted.
    fn break_group(&mut self, e: &Error) {
        if self.broken.is_none() {
            self.broken = Some(e.clone());
        }
        self.route.local.fail(e);
        self.route.mesh.shutdown_telling(Some(&e.to_string()));
    }

    /// Every rank: the probe where it is rank 0 or its partner (probe.rs), then rank 0's choice
    /// told to all, and every connection set to it. `opened`: the bandwidth pairs' streams;
    /// `forced`: WIRESPEED_NSTREAMS is set here (rank 0's decides).
    fn choose_streams(&mut self, opened: usize, forced: bool) -> Result<probe::StreamChoice> {
        let mut mine = None;
        self.guarded(|c| {
            mine = probe::measure(&mut c.route, opened, forced)?;
            Ok(())
        })?;
        let mut buf = mine.map_or_else(|| vec![0u8; probe::ENCODED], |m| m.encode());
        // SAFETY: `buf` is ours, ENCODED bytes on every rank, read on rank 0 and written elsewhere,
        // and lives until the broadcast returns.
        unsafe { Collectives::broadcast(self, (buf.as_mut_ptr() as usize, buf.len()), 0)? };
        let choice = probe::StreamChoice::decode(&buf);
        self.route.mesh.use_streams(choice.used);
        Ok(choice)
    }

    fn all_reduce_impl(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let algo = self.tuning.pick_across_hosts(buf.len(), self.world, self.route.lay.hosts.len());
        let tag = self.tag(Kind::AllReduce, Some(dtype), Some(op), algo as usize);
        let world = self.world;
        match algo {
            NetAlgo::Ring => {
                let members: Vec<usize> = (0..world).collect();
                crate::algo::ring::all_reduce(&mut self.route, &members, tag, buf, dtype, op, world, &mut self.scratch)
            }
            // pick_across_hosts gives Hier for doubling: the leaders' choice is pick_among_leaders'.
            NetAlgo::Hier | NetAlgo::Doubling => hier::all_reduce(&mut self.route, &self.tuning, &mut self.scratch, tag, buf, dtype, op),
        }
    }

    /// The root's data crosses each other host's link once: a shared-memory broadcast inside the
    /// root's host (so its leader has the data), a binomial tree over the hosts' leaders
    /// (connected by the full streams), then a shared-memory broadcast inside every other host.
    /// # Safety
    /// `Collectives::broadcast`'s buffer contract (api.rs) for `buf`; called inside `guarded`,
    /// which shuts the connections on an error (algo/mod.rs, "Buffers and errors").
    unsafe fn broadcast_impl(&mut self, buf: Buf, root: usize) -> Result<()> {
        let tag = self.tag(Kind::Broadcast, None, None, root);
        let r = &mut self.route;
        let rh = r.lay.host_of[root];
        let mine = r.my_host();
        let local_many = r.lay.hosts[mine].len() > 1;
        if mine == rh && local_many {
            // SAFETY: this fn's contract: `buf` is valid until this returns, read on the root
            // and written on its host's other ranks, as Comm::broadcast's contract asks.
            unsafe { r.local.broadcast(buf, r.lay.local_of[root])? };
        }
        let tree_root = r.lay.hosts[rh][0];
        let members: Vec<usize> = std::iter::once(tree_root)
            .chain((0..r.lay.hosts.len()).filter(|&h| h != rh).map(|h| r.lay.hosts[h][0]))
            .collect();
        if members.len() > 1 && members.contains(&r.rank) {
            // SAFETY: this fn's contract: `buf` is ours for the call. The slice lives only for
            // the tree below, and nothing else reaches the memory meanwhile.
            let b = unsafe { std::slice::from_raw_parts_mut(buf.0 as *mut u8, buf.1) };
            crate::algo::tree::broadcast(r, &members, tag, b, tree_root)?;
        }
        if mine != rh && local_many {
            // SAFETY: this fn's contract, as for the root's host: `buf` is valid until this
            // returns; the local broadcast from the leader (local rank 0) writes it here.
            unsafe { r.local.broadcast(buf, 0)? };
        }
        Ok(())
    }

    /// The ring all_gather and reduce_scatter run on: hosts in order, each host's ranks forward
    /// on even hosts and backward on odd ones, so that each hop between hosts joins ranks of the
    /// same local index, the pairs `HostLayout::pair_streams` gives the full stream count (all of
    /// them with one rank per host or an even number of hosts; otherwise all but the hop that
    /// closes the ring). Each host's link then carries n-1 chunks each way (the least is n-L
    /// for L ranks per host), where a direct exchange carries L(n-L).
    fn ring_order(&self) -> Vec<usize> {
        self.route.lay.hosts.iter().enumerate().flat_map(|(h, rs)| if h % 2 == 0 { rs.clone() } else { rs.iter().rev().copied().collect() }).collect()
    }

    /// How all_gather and reduce_scatter cross hosts for `bytes` per rank's piece: the ring
    /// where `Tuning::gather_on_ring` says; below its threshold, through the host leaders (a
    /// rank talks to its leader only, a leader to O(log hosts) leaders). Otherwise (one host, or
    /// two hosts from the threshold on) a direct exchange: its scratch stays bounded (the
    /// leaders stage a whole output, or twice a rank's whole input), and across two hosts a rank
    /// reaches only the other host's ranks anyway.
    fn gather_algo(&self, bytes: usize) -> Gather {
        let hosts = self.route.lay.hosts.len();
        if self.tuning.gather_on_ring(bytes, hosts) {
            Gather::Ring
        } else if hosts > 1 && bytes < self.tuning.gather_ring_min {
            Gather::Leaders
        } else {
            Gather::Direct
        }
    }

    /// Whether this all_to_all goes through the host leaders (`Tuning::a2a_through_leaders`).
    /// A rank knows only its own pieces' lengths and every rank must choose alike, so the ranks
    /// first agree on the largest piece anywhere: a one-number max all_reduce, hierarchical
    /// with doubling among the leaders (`hier::agree`), so it adds no peer the leaders' path
    /// does not have. One host: no question.
    fn a2a_through_leaders(&mut self, send: &[Buf], recv: &[Buf]) -> Result<bool> {
        let hosts = self.route.lay.hosts.len();
        if hosts < 2 {
            return Ok(false);
        }
        let mine = send.iter().chain(recv).map(|b| b.1).max().unwrap_or(0) as u64;
        let mut largest = mine.to_le_bytes();
        let tag = self.tag(Kind::AllToAll, Some(DType::U64), Some(ReduceOp::Max), 0);
        hier::agree(&mut self.route, &mut self.scratch, tag, &mut largest, DType::U64, ReduceOp::Max)?;
        Ok(self.tuning.a2a_through_leaders(u64::from_le_bytes(largest) as usize, hosts))
    }

    /// How gather and scatter cross hosts: through the host leaders whenever there are two hosts
    /// or more, whatever the sizes. Only the root knows every piece's length (a rank knows its
    /// own), so a size rule would need an agreement first, a round of its own on every call;
    /// and the bytes the root's host link carries are the same either way (every other host's
    /// pieces, once), where the direct exchange makes the root talk to every rank. The price is
    /// a copy at each hop and the leaders' scratch: a leader stages its subtree's pieces, the
    /// root's leader (and a root that leads no host) the whole output. One host: direct.
    fn rooted_algo(&self) -> Gather {
        if self.route.lay.hosts.len() > 1 { Gather::Leaders } else { Gather::Direct }
    }

    /// gather's and scatter's tag: its root field holds the root, so the algorithm (`Gather`'s
    /// number) goes in the op field, which they leave empty: ranks that chose differently meet
    /// a Mismatch, not mixed data.
    fn rooted_tag(&mut self, kind: Kind, root: usize, algo: Gather) -> u64 {
        (self.tag(kind, None, None, root) & !(0xffu64 << 40)) | ((algo as u64) << 40)
    }

    /// A caller's range as the algorithms take it.
    fn region((a, l): Buf) -> Region {
        Region { ptr: a as *mut u8, len: l }
    }

    fn spans(bufs: &[Buf]) -> Vec<Region> {
        bufs.iter().map(|&b| Group::region(b)).collect()
    }

    fn regions(bufs: &[Buf]) -> Vec<Option<Region>> {
        bufs.iter().map(|&b| Some(Group::region(b))).collect()
    }
}

/// Each method's `# Safety` is `Collectives`' buffer contract (api.rs). The ops run inside
/// `guarded`, which breaks the group on an error before returning, so nothing posted into a
/// caller's buffer outlives the call (algo/mod.rs, "Buffers and errors"); `send_post` breaks the
/// group itself when posting fails.
impl Collectives for Group {
    fn rank(&self) -> usize {
        self.rank
    }
    // SAFETY: sound on Collectives' contract alone: `buf` goes to hier/ring/doubling over the route
    // within this call, and `guarded` shuts the route on an error.
    unsafe fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        // SAFETY: `Collectives`' contract (api.rs): `buf` holds `count` elements of `dtype`,
        // ours until this returns; the slice does not outlive the call.
        let b = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, count * dtype.size()) };
        self.guarded(|c| c.all_reduce_impl(b, dtype, op))
    }
    // SAFETY: sound on Collectives' contract alone: the inputs and `out` go to ring or direct over
    // the route within this call; `guarded` shuts it on an error.
    unsafe fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        check_list(self.world, send.len(), "reduce_scatter inputs")?;
        self.guarded(|c| {
            // The tag's root field says which algorithm runs: ranks that chose differently meet
            // a Mismatch, not mixed data.
            let algo = c.gather_algo(count * dtype.size());
            let tag = c.tag(Kind::ReduceScatter, Some(dtype), Some(op), algo as usize);
            let regions = Group::spans(send);
            let world = c.world;
            match algo {
                Gather::Ring => {
                    let members = c.ring_order();
                    let by_pos: Vec<Region> = members.iter().map(|&r| regions[r]).collect();
                    // SAFETY: `Collectives`' contract (api.rs) is ring::reduce_scatter's, the
                    // regions merely listed in ring order: every send[j] and `out` hold `count`
                    // elements until this returns, `out` overlapping only send[rank] at the same
                    // address; on an error `guarded` shuts the connections.
                    unsafe { crate::algo::ring::reduce_scatter(&mut c.route, &members, tag, &by_pos, out as *mut u8, count, dtype, op, world, &mut c.scratch) }
                }
                Gather::Leaders => {
                    let hosts = c.route.lay.hosts.clone();
                    // SAFETY: `Collectives`' contract (api.rs) is leaders::reduce_scatter's (the
                    // direct one's): every send[j] and `out` hold `count` elements until this
                    // returns, `out` overlapping only send[rank] at the same address; the
                    // scratch is the group's; on an error `guarded` shuts the connections.
                    unsafe { crate::algo::leaders::reduce_scatter(&mut c.route, &hosts, tag, &regions, out as *mut u8, count, dtype, op, world, &mut c.scratch) }
                }
                Gather::Direct => {
                    let members: Vec<usize> = (0..world).collect();
                    // SAFETY: `Collectives`' contract (api.rs) is direct::reduce_scatter's: every
                    // send[j] and `out` hold `count` elements until this returns, `out`
                    // overlapping only send[rank] at the same address; on an error `guarded`
                    // shuts the connections.
                    unsafe { crate::algo::direct::reduce_scatter(&mut c.route, &members, tag, &regions, out as *mut u8, count, dtype, op, world, &mut c.scratch) }
                }
            }
        })
    }
    // SAFETY: sound on Collectives' contract alone: `buf` is reduced inside the host and across
    // leaders within this call, under `guarded`.
    unsafe fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        // SAFETY: as for all_reduce: `buf`, `count` elements, is ours until this returns.
        let b = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, count * dtype.size()) };
        self.guarded(|c| {
            // The path follows from the layout alone, the same on every rank: the tag need not
            // say it (its root field holds the root).
            let tag = c.tag(Kind::Reduce, Some(dtype), Some(op), root);
            let world = c.world;
            if c.route.lay.hosts.len() > 1 {
                let hosts = c.route.lay.hosts.clone();
                return crate::algo::leaders::reduce(&mut c.route, &hosts, tag, b, dtype, op, root, world, &mut c.scratch);
            }
            let members: Vec<usize> = (0..world).collect();
            crate::algo::tree::reduce(&mut c.route, &members, tag, b, dtype, op, root, world, &mut c.scratch)
        })
    }
    // SAFETY: sound on Collectives' contract alone: `send` and `recv` go to ring or direct over the
    // route within this call, under `guarded`.
    unsafe fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()> {
        check_list(self.world, recv.len(), "all_gather outputs")?;
        self.guarded(|c| {
            // Chosen by the longest piece, which every rank knows (recv[j].1): the same choice
            // everywhere, also when the pieces differ.
            let algo = c.gather_algo(recv.iter().map(|r| r.1).max().unwrap_or(0));
            let tag = c.tag(Kind::AllGather, None, None, algo as usize);
            let own = Group::region(send);
            let outs = Group::spans(recv);
            match algo {
                Gather::Ring => {
                    let members = c.ring_order();
                    let by_pos: Vec<Region> = members.iter().map(|&r| outs[r]).collect();
                    // SAFETY: `Collectives`' contract (api.rs) is ring::all_gather's, the outputs
                    // merely listed in ring order: `send` readable, every recv[j] writable and
                    // ours (recv[rank] being `send` or disjoint from it) until this returns; on
                    // an error `guarded` shuts the connections.
                    unsafe { crate::algo::ring::all_gather(&mut c.route, &members, tag, own, &by_pos) }
                }
                Gather::Leaders => {
                    let hosts = c.route.lay.hosts.clone();
                    // SAFETY: `Collectives`' contract (api.rs) is leaders::all_gather's (the
                    // direct exchange's): `send` readable, every recv[j] writable and ours
                    // (recv[rank] being `send` or disjoint from it) until this returns; the
                    // scratch is the group's; on an error `guarded` shuts the connections.
                    unsafe { crate::algo::leaders::all_gather(&mut c.route, &hosts, tag, own, &outs, &mut c.scratch) }
                }
                Gather::Direct => {
                    let members: Vec<usize> = (0..c.world).collect();
                    // SAFETY: `Collectives`' contract (api.rs) is direct::exchange's: `send`
                    // readable, every recv[j] writable and ours (recv[rank] being `send` or
                    // disjoint from it) until this returns; on an error `guarded` shuts the
                    // connections.
                    unsafe { crate::algo::direct::exchange(&mut c.route, &members, tag, &Group::regions(&vec![send; members.len()]), &Group::regions(recv)) }
                }
            }
        })
    }
    // SAFETY: sound on Collectives' contract alone: every region goes to the leaders' all_to_all
    // or one direct exchange over the route within this call, under `guarded`.
    unsafe fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()> {
        check_list(self.world, send.len(), "all_to_all inputs")?;
        check_list(self.world, recv.len(), "all_to_all outputs")?;
        self.guarded(|c| {
            let leaders = c.a2a_through_leaders(send, recv)?;
            // The tag's root field says which algorithm runs, as for reduce_scatter.
            let tag = c.tag(Kind::AllToAll, None, None, leaders as usize);
            if leaders {
                let hosts = c.route.lay.hosts.clone();
                let (s, r) = (Group::spans(send), Group::spans(recv));
                // SAFETY: `Collectives`' contract (api.rs) is leaders_a2a::all_to_all's: every
                // send[j] readable, every recv[j] writable and ours (recv[rank] being send[rank]
                // or disjoint from it) until this returns; on an error `guarded` shuts the
                // connections and fails the local group.
                return unsafe { crate::algo::leaders_a2a::all_to_all(&mut c.route, &hosts, tag, &s, &r) };
            }
            let members: Vec<usize> = (0..c.world).collect();
            // SAFETY: as for all_gather, with one send range per destination.
            unsafe { crate::algo::direct::exchange(&mut c.route, &members, tag, &Group::regions(send), &Group::regions(recv)) }
        })
    }
    // SAFETY: sound on Collectives' contract alone: `buf` is read or written by broadcast_impl
    // within this call, under `guarded`.
    unsafe fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        // SAFETY: `Collectives::broadcast`'s contract (api.rs) is broadcast_impl's, which runs
        // inside `guarded` as it asks.
        self.guarded(|c| unsafe { c.broadcast_impl(buf, root) })
    }
    // SAFETY: sound on Collectives' contract alone: `send` and the root's `recv` go to the leaders'
    // gather or one direct exchange within this call, under `guarded`.
    unsafe fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        if self.rank == root {
            check_list(self.world, recv.len(), "gather outputs on the root")?;
        }
        self.guarded(|c| {
            let algo = c.rooted_algo();
            let tag = c.rooted_tag(Kind::Gather, root, algo);
            let own = Group::region(send);
            if algo == Gather::Leaders {
                let hosts = c.route.lay.hosts.clone();
                let outs = Group::spans(recv);
                // SAFETY: `Collectives`' contract (api.rs) is leaders_gs::gather's: `send`
                // readable and, on the root, every recv[j] writable and ours (recv[root] being
                // `send` or disjoint from it) until this returns; the scratch is the group's; on
                // an error `guarded` shuts the connections.
                return unsafe { crate::algo::leaders_gs::gather(&mut c.route, &hosts, tag, own, &outs, root, &mut c.scratch) };
            }
            let members: Vec<usize> = (0..c.world).collect();
            // Every rank sends to the root only; the root receives from all (its own piece copied).
            let mut sends = vec![None; c.world];
            sends[root] = Some(own);
            let recvs = if c.rank == root { Group::regions(recv) } else { vec![None; c.world] };
            // SAFETY: `Collectives`' contract (api.rs) is direct::exchange's: `send` readable and,
            // on the root, every recv[j] writable and ours (recv[root] being `send` or disjoint
            // from it); every other entry is None. On an error `guarded` shuts the connections.
            unsafe { crate::algo::direct::exchange(&mut c.route, &members, tag, &sends, &recvs) }
        })
    }
    // SAFETY: sound on Collectives' contract alone: the root's `send` and `recv` go to the leaders'
    // scatter or one direct exchange within this call, under `guarded`.
    unsafe fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        if self.rank == root {
            check_list(self.world, send.len(), "scatter inputs on the root")?;
        }
        self.guarded(|c| {
            let algo = c.rooted_algo();
            let tag = c.rooted_tag(Kind::Scatter, root, algo);
            let own = Group::region(recv);
            if algo == Gather::Leaders {
                let hosts = c.route.lay.hosts.clone();
                let ins = Group::spans(send);
                // SAFETY: `Collectives`' contract (api.rs) is leaders_gs::scatter's: `recv`
                // writable and ours and, on the root, every send[j] readable (send[root] being
                // `recv` or disjoint from it) until this returns; the scratch is the group's; on
                // an error `guarded` shuts the connections.
                return unsafe { crate::algo::leaders_gs::scatter(&mut c.route, &hosts, tag, &ins, own, root, &mut c.scratch) };
            }
            let members: Vec<usize> = (0..c.world).collect();
            // The root sends to all (its own piece copied); every rank receives from the root only.
            let sends = if c.rank == root { Group::regions(send) } else { vec![None; c.world] };
            let mut recvs = vec![None; c.world];
            recvs[root] = Some(own);
            // SAFETY: `Collectives`' contract (api.rs) is direct::exchange's: `recv` writable and
            // ours and, on the root, every send[j] readable (send[root] being `recv` or disjoint
            // from it); every other entry is None. On an error `guarded` shuts the connections.
            unsafe { crate::algo::direct::exchange(&mut c.route, &members, tag, &sends, &recvs) }
        })
    }
    fn barrier(&mut self) -> Result<()> {
        self.guarded(|c| {
            let across = c.route.lay.hosts.len() > 1;
            let tag = c.tag(Kind::Barrier, None, None, across as usize);
            if across {
                let hosts = c.route.lay.hosts.clone();
                return crate::algo::leaders::barrier(&mut c.route, &hosts, tag);
            }
            let members: Vec<usize> = (0..c.world).collect();
            crate::algo::direct::barrier(&mut c.route, &members, tag)
        })
    }
    // SAFETY: sound on Collectives' contract alone: the bytes stay the caller's until the returned
    // ticket completes, as the shm send and the TCP send it wraps ask.
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket> {
        check_rank(self.world, to, "send to")?;
        if to == self.rank {
            return Err(Error::Unsupported(format!("rank {to} cannot send to itself")));
        }
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        // A ticket of its own, not a Transport handle: it outlives this call (the engine waits
        // it). If the group breaks first, `break_group` shuts the connections and marks the
        // local group aborted, so no late reader uses the bytes.
        let route = &mut self.route;
        let r = match route.local_index(to) {
            // SAFETY: `Collectives::send_post`'s contract (api.rs) is post_to's: the bytes stay
            // readable and unwritten until the ticket completes.
            Some(l) => unsafe { route.local.post_to(l, addr, len, tag) }.map(|t| Box::new(t) as Ticket),
            // SAFETY: the same contract is the mesh's `send`'s.
            None => unsafe { route.mesh.send(to, addr as *const u8, len, tag) }.map(|t| Box::new(t) as Ticket),
        };
        if let Err(e) = &r {
            self.break_group(e);
        }
        r
    }
    fn abort(&mut self, e: &Error) {
        self.break_group(e);
    }
    fn tcp_streams(&self) -> usize {
        (0..self.world).map(|r| self.streams_to(r)).sum()
    }
    // SAFETY: sound on Collectives' contract alone: `addr` is posted to the route and waited before
    // this returns; an error breaks the group, so no late write.
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()> {
        check_rank(self.world, from, "receive from")?;
        if from == self.rank {
            return Err(Error::Unsupported(format!("rank {from} cannot receive from itself")));
        }
        // Through the group's own Transport, which routes the peer. Inside `guarded`: a failed
        // wait shuts the connections, so a TCP receive still posted cannot land later.
        self.guarded(|c| {
            // SAFETY: `Collectives::recv`'s contract (api.rs) is post_recv's: the bytes are
            // writable and ours until the handle is waited, just below, or the group breaks.
            let h = unsafe { c.route.post_recv(from, addr as *mut u8, len, tag)? };
            c.route.wait(h)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Collectives;
    use std::sync::{Arc, Barrier};
    use std::time::Instant;

    /// A panic in a collective while a TCP receive is posted into the scratch buffer: the
    /// scratch is kept (not freed under the receive), the connections are shut (so the
    /// receive can no longer land, and the peer fails at once), and the group is broken.
    #[test]
    fn a_panic_with_a_receive_posted_into_scratch_stops_it_and_keeps_the_scratch() {
        let token = crate::sys::random_token().unwrap();
        let ids = vec!["a".to_string(), "b".to_string()];
        let cfg = Config::from_vars(&|v| (v == "WIRESPEED_IFNAME").then(|| "lo".to_string())).unwrap();
        let setups: Vec<Setup> = (0..2).map(|r| Setup::new(r, 2, token, Duration::from_secs(3), &ids, &[], &cfg).unwrap()).collect();
        let infos: Vec<RankInfo> = setups.iter().map(|s| s.info()).collect();
        let both = Arc::new(Barrier::new(2));
        let n = 1 << 20;
        let hs: Vec<_> = setups
            .into_iter()
            .map(|s| {
                let (infos, both) = (infos.clone(), both.clone());
                std::thread::spawn(move || {
                    let mut c = s.connect(&infos).unwrap();
                    if c.rank == 0 {
                        // Caught here too, so that without the fix the test fails instead of hanging.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            c.guarded(|c| {
                                let p = crate::algo::scratch(&mut c.scratch, n).as_mut_ptr();
                                // SAFETY: `p` is `n` bytes of the group's scratch, which stays
                                // in the group (not freed) even when this panics; `guarded`
                                // then shuts the connections, so the receive cannot land later.
                                unsafe { c.route.post_recv(1, p, n, 7)? };
                                panic!("a bug")
                            })
                        }));
                        let kept = c.scratch.len() >= n;
                        let next = c.barrier();
                        both.wait();
                        // Keep the group until rank 1 has tried: dropping it would shut the connections.
                        both.wait();
                        vec![matches!(r, Ok(Err(Error::Broken(ref m))) if m.contains("a bug")), kept, matches!(next, Err(Error::Broken(_)))]
                    } else {
                        both.wait();
                        let mut got = vec![0u8; n];
                        let t = Instant::now();
                        // SAFETY: `got` lives, untouched by anyone else, through the call.
                        let r = unsafe { c.recv(0, got.as_mut_ptr() as usize, n, 8) };
                        let fast = t.elapsed() < Duration::from_secs(2);
                        both.wait();
                        vec![r.is_err(), fast]
                    }
                })
            })
            .collect();
        let out: Vec<Vec<bool>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(out, vec![vec![true, true, true], vec![true, true]]);
    }
}
