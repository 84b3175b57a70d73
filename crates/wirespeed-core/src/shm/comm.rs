//! The shared-memory group of the ranks of one host: setup, the wait that spins then sleeps, sync
//! points, failure detection and op descriptors. It is the whole group when every rank shares a
//! host (group.rs, `Setup::OneHost`), and the inside-a-host part of a group that spans hosts
//! (hosts/: each `hosts::Group` holds one over the ranks of its host, numbered locally). The
//! collectives built on these live in collectives.rs and p2p.rs.
//!
//! Setup is two steps so any store can carry the rendezvous: `Comm::new` creates this rank's
//! segment and returns what peers need (pid, memfd number, host id); the caller exchanges those
//! through its store and hands every rank's info to `connect`.
use crate::api::{Kind, RankInfo};
use crate::config::Config;
use crate::error::{Error, Result};
use super::segment::{DescHeader, SegmentLayout, Piece, Seg, MAGIC};
use crate::sys::{self, Mapping, PidFd};
use std::sync::atomic::{fence, AtomicU32, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a waiter spins before it sleeps, and whether it yields the CPU while spinning.
#[derive(Clone, Copy, Debug)]
pub struct SpinPolicy {
    pub spin: Duration,
    pub yield_while_spinning: bool,
}

impl SpinPolicy {
    /// Spin ~200 us when every rank has a core. A futex wake-up costs ~30 us on this VM, and a
    /// shorter spin can lock two ranks into a cycle: the one woken late arrives at the next op
    /// after the other has given up spinning, which then sleeps and is woken late in turn (seen
    /// with 50 us and torch's ~10 us of Python per op: 85 us per 4 KiB all_reduce instead of 14).
    /// When ranks outnumber cores, spinning only steals the core the awaited peer needs, so yield.
    /// `spin_us` replaces the 200 us where given (WIRESPEED_SPIN_US, `Config::spin_us`).
    pub fn for_ranks(local_ranks: usize, spin_us: Option<u64>) -> SpinPolicy {
        let cpus = sys::cpus_available();
        if local_ranks > cpus {
            SpinPolicy { spin: Duration::from_micros(spin_us.unwrap_or(200)), yield_while_spinning: true }
        } else {
            SpinPolicy { spin: Duration::from_micros(spin_us.unwrap_or(200)), yield_while_spinning: false }
        }
    }
}

/// Longest single sleep: the latency of noticing a dead or aborted peer.
const SLEEP_SLICE: Duration = Duration::from_millis(20);

/// A segment's `aborted` word: its rank broke the group (every peer's waits fail), or closed it
/// (waits on that rank, and copies of its memory, fail). 0 while it lives.
const ABORTED: u32 = 1;
const CLOSED: u32 = 2;

/// The connected group's shared, read-only state: what a waiter needs, so a send's completion can
/// be awaited without holding the group's execution lock.
pub struct Net {
    pub rank: usize,
    pub world: usize,
    pub(crate) segs: Vec<Seg>,
    pub(crate) pids: Vec<i32>,
    pidfds: Vec<Option<PidFd>>,
    pub timeout: Duration,
    pub(crate) spin: SpinPolicy,
    /// The job's rank of each member, for errors: in a group of one host's ranks inside a
    /// multi-host job (hosts/), member 1 may be rank 3, and "peer rank 1 died" would name the
    /// wrong process. The identity when the group is the whole job.
    names: Vec<usize>,
}

pub struct Comm {
    pub rank: usize,
    pub world: usize,
    pub(crate) lay: SegmentLayout,
    pub(crate) net: Arc<Net>,
    own_fd: i32,
    pub(crate) token: [u8; 16],
    pub(crate) seq: u64,
    pub(crate) broken: Option<Error>,
    pub(crate) scratch: Vec<u8>,
    pub(crate) p2p_sent: Vec<u32>,
    pub(crate) p2p_recvd: Vec<u32>,
    pub(crate) tuning: crate::plan::Tuning,
    /// This rank's host id (`Config::host_id`), published in its `RankInfo`.
    host: String,
    /// CPUs the planner assumes: the least any rank of the host may run on, agreed at connect
    /// (read once: a system call per op would cost ~0.3 us).
    pub(crate) cpus: usize,
    /// Keeps peers allowed to read this process's memory while the group lives.
    _attach: sys::AttachGuard,
}

impl Comm {
    /// Create this rank's segment. `token` names the job; peers with another token are refused.
    /// `cfg` gives the planner's knobs, the waits' spin and the host id.
    pub fn new(rank: usize, world: usize, token: [u8; 16], timeout: Duration, cfg: &Config) -> Result<Comm> {
        if world == 0 || rank >= world {
            return Err(Error::Unsupported(format!("rank {rank} is outside a world of {world}")));
        }
        let tuning = cfg.tuning;
        let lay = SegmentLayout::new(world, tuning.slot_bytes);
        let (fd, map) = sys::memfd_segment(lay.total)?;
        let own = Seg { map: Arc::new(map), lay };
        own.write_header(&token, rank, world, sys::getpid(), sys::cpus_available());
        let attach = sys::allow_peers_to_attach();
        Ok(Comm {
            rank,
            world,
            lay,
            net: Arc::new(Net {
                rank,
                world,
                segs: vec![own],
                pids: vec![],
                pidfds: vec![],
                timeout,
                spin: SpinPolicy::for_ranks(world, cfg.spin_us),
                names: (0..world).collect(),
            }),
            own_fd: fd,
            token,
            seq: 0,
            broken: None,
            scratch: Vec::new(),
            p2p_sent: vec![0; world],
            p2p_recvd: vec![0; world],
            tuning,
            host: cfg.host_id(),
            cpus: sys::cpus_available(),
            _attach: attach,
        })
    }

    pub fn info(&self) -> RankInfo {
        RankInfo { pid: sys::getpid(), fd: self.own_fd, host: self.host.clone(), addr: String::new() }
    }

    /// Name the members by their ranks in the job (`job_ranks[i]` is member i's), so that this
    /// group's errors about a peer name the rank the user knows. Before `connect`.
    pub(crate) fn name_members(&mut self, job_ranks: Vec<usize>) -> Result<()> {
        if job_ranks.len() != self.world {
            return Err(Error::Mismatch(format!("{} job ranks for a group of {}", job_ranks.len(), self.world)));
        }
        match Arc::get_mut(&mut self.net) {
            Some(net) => {
                net.names = job_ranks;
                Ok(())
            }
            None => Err(Error::Unsupported("members are named before the group connects".into())),
        }
    }

    /// Map every peer's segment, check it belongs to this job, then wait for all ranks to do the
    /// same before closing the memfd (after that, only the mappings keep the memory alive).
    pub fn connect(&mut self, infos: &[RankInfo]) -> Result<()> {
        if infos.len() != self.world {
            return Err(Error::Mismatch(format!("{} rank infos for a world of {}", infos.len(), self.world)));
        }
        let me = &infos[self.rank];
        // A Comm only ever joins the ranks of one host: `Setup` builds one only when every rank
        // shares a host, and `hosts::Setup` hands its own the infos of its host alone. Ranks on
        // several hosts connect through `Setup` (hosts/), not here.
        if let Some((r, other)) = infos.iter().enumerate().find(|(_, i)| i.host != me.host) {
            return Err(Error::Unsupported(format!(
                "rank {r} runs on another host ({}): this build of wirespeed connects ranks on one host \
                 only (shared memory); use gloo across hosts",
                other.host.split('/').next().unwrap_or("?")
            )));
        }
        let own = self.net.segs[0].clone();
        let mut segs = Vec::with_capacity(self.world);
        let mut pidfds = Vec::with_capacity(self.world);
        for (r, info) in infos.iter().enumerate() {
            if r == self.rank {
                segs.push(own.clone());
                pidfds.push(None);
                continue;
            }
            let map: Mapping = sys::map_peer_segment(info.pid, info.fd).map_err(|e| match e {
                Error::Os { errno, .. } if errno == libc::ENOENT || errno == libc::ESRCH => {
                    Error::PeerDied { rank: self.net.job_rank(r), pid: info.pid }
                }
                Error::Os { errno, .. } if errno == libc::EACCES || errno == libc::EPERM => Error::Unsupported(format!(
                    "cannot open rank {r}'s shared memory (pid {}): wirespeed needs ranks of one host to run \
                     as the same user with ptrace access (kernel.yama.ptrace_scope <= 1)",
                    info.pid
                )),
                e => e,
            })?;
            if map.len() < self.lay.total {
                return Err(Error::Stranger(format!("rank {r}'s segment is {} bytes, expected {}", map.len(), self.lay.total)));
            }
            let seg = Seg { map: Arc::new(map), lay: self.lay };
            if seg.magic() != MAGIC || seg.token() != self.token || seg.rank() != r || seg.world() != self.world {
                return Err(Error::Stranger(format!(
                    "the process registered as rank {r} (pid {}) is not rank {r} of this job (token/rank/world differ)",
                    info.pid
                )));
            }
            let died = Error::PeerDied { rank: self.net.job_rank(r), pid: info.pid };
            pidfds.push(Some(PidFd::open(info.pid).map_err(|_| died)?));
            segs.push(seg);
        }
        let net = Net {
            rank: self.rank,
            world: self.world,
            segs,
            pids: infos.iter().map(|i| i.pid).collect(),
            pidfds,
            timeout: self.net.timeout,
            spin: self.net.spin,
            names: self.net.names.clone(),
        };
        self.net = Arc::new(net);
        // The planner's CPU input, the same on every rank: the least any rank of the host has.
        self.cpus = self.net.segs.iter().map(|s| s.cpus()).min().unwrap_or(1).max(1);
        let net = self.net.clone();
        // Cross-memory attach must work for the large-message paths: probe it now, once.
        for r in 0..self.world {
            if r != self.rank {
                let mut probe = 0u64;
                // SAFETY: `probe` is a local u64: 8 writable bytes that nothing else touches.
                if let Err(errno) = unsafe { sys::read_peer(net.pids[r], net.segs[r].owner_addr(), &mut probe as *mut u64 as *mut u8, 8) } {
                    return Err(if errno == libc::ESRCH {
                        Error::PeerDied { rank: net.job_rank(r), pid: net.pids[r] }
                    } else {
                        Error::Unsupported(format!(
                            "process_vm_readv on rank {r} failed ({}): wirespeed needs ranks of one host to run as the \
                             same user with ptrace access (kernel.yama.ptrace_scope <= 1)",
                            std::io::Error::from_raw_os_error(errno)
                        ))
                    });
                }
                if probe != MAGIC {
                    return Err(Error::Stranger(format!("rank {r}'s memory does not hold its segment")));
                }
            }
        }
        net.sync()?;
        sys::close_fd(self.own_fd);
        self.own_fd = -1;
        Ok(())
    }

    pub(crate) fn own(&self) -> &Seg {
        self.net.own()
    }

    /// Publish this op's descriptor (by op parity) and sync; then check every rank called the same
    /// thing. Every rank compares every descriptor, so a mismatch is raised on all of them.
    pub(crate) fn publish_and_sync(&mut self, h: DescHeader, pieces: &[Piece]) -> Result<usize> {
        let parity = (self.seq % 2) as usize;
        self.own().write_desc(parity, &h, pieces);
        self.net.sync()?;
        for r in 0..self.world {
            let d = self.net.segs[r].desc(parity);
            let mine = &h;
            if d.seq != mine.seq {
                return Err(Error::Mismatch(format!(
                    "rank {r} is at collective #{} while rank {} is at #{} (a rank skipped or added a call)",
                    d.seq, self.rank, mine.seq
                )));
            }
            if d.kind != mine.kind {
                return Err(Error::Mismatch(format!(
                    "rank {r} called {} while rank {} called {}",
                    Kind::name_of(d.kind), self.rank, Kind::name_of(mine.kind)
                )));
            }
            if d.dtype != mine.dtype {
                return Err(Error::Mismatch(format!(
                    "rank {r} passed {} tensors while rank {} passed {}",
                    dtype_name(d.dtype), self.rank, dtype_name(mine.dtype)
                )));
            }
            if d.op != mine.op || d.root != mine.root {
                return Err(Error::Mismatch(format!("rank {r} used op {}/root {} while rank {} used op {}/root {}",
                    d.op, d.root, self.rank, mine.op, mine.root)));
            }
            if d.count != mine.count && d.count != u64::MAX && mine.count != u64::MAX {
                return Err(Error::Mismatch(format!(
                    "rank {r} passed {} elements while rank {} passed {} ({})",
                    d.count, self.rank, mine.count, Kind::name_of(mine.kind)
                )));
            }
            // After the count check: different sizes also choose differently, and say so better.
            if d.algo != mine.algo {
                return Err(Error::Mismatch(format!(
                    "rank {r} chose algorithm {} for {} while rank {} chose {}: set the WIRESPEED_* tuning variables alike on every rank",
                    d.algo, Kind::name_of(mine.kind), self.rank, mine.algo
                )));
            }
        }
        Ok(parity)
    }

    /// A scratch buffer of at least `n` bytes (kept between ops).
    pub(crate) fn scratch(&mut self, n: usize) -> *mut u8 {
        if self.scratch.len() < n {
            self.scratch = vec![0u8; n.next_power_of_two()];
        }
        self.scratch.as_mut_ptr()
    }


    /// Mark the group broken and tell peers why, so they raise instead of waiting out the timeout.
    pub(crate) fn fail(&mut self, e: &Error) {
        self.give_up(e, ABORTED);
    }

    /// `fail`, with the flag value peers see: ABORTED or CLOSED (see `Net::check_peers`).
    fn give_up(&mut self, e: &Error, flag: u32) {
        if self.broken.is_none() {
            self.broken = Some(e.clone());
            let own = self.net.own();
            own.set_reason(&e.to_string());
            own.aborted().store(flag, Release);
            fence(SeqCst);
            sys::futex_wake_all(own.phase());
            for r in 0..self.world {
                sys::futex_wake_all(own.posted(r));
                sys::futex_wake_all(own.acked(r));
            }
        }
    }

}

impl Net {
    /// Member `r`'s rank in the job (see `names`).
    pub(crate) fn job_rank(&self, r: usize) -> usize {
        self.names.get(r).copied().unwrap_or(r)
    }

    pub(crate) fn own(&self) -> &Seg {
        &self.segs[self.rank]
    }

    /// Publish a store to one of this rank's words: wake peers only if one sleeps on this segment.
    pub(crate) fn bump(&self, word: &AtomicU32) -> u32 {
        let v = word.fetch_add(1, SeqCst).wrapping_add(1);
        fence(SeqCst);
        if self.own().sleepers().load(SeqCst) > 0 {
            sys::futex_wake_all(word);
        }
        v
    }

    /// First failure among peers that concerns a wait on rank `peer`: any peer that aborted
    /// (with its message), `peer` if it closed the group, or a peer whose process ended. A peer
    /// that closed after its last op is no reason to fail ranks still busy among themselves.
    pub(crate) fn check_peers(&self, peer: usize) -> Result<()> {
        for (r, s) in self.segs.iter().enumerate() {
            let flag = if r == self.rank { 0 } else { s.aborted().load(Acquire) };
            if flag == ABORTED || (flag != 0 && r == peer) {
                return Err(Error::PeerAborted { rank: self.job_rank(r), reason: s.reason() });
            }
        }
        if let Some(r) = sys::first_exited(&self.pidfds) {
            return Err(Error::PeerDied { rank: self.job_rank(r), pid: self.pids[r] });
        }
        Ok(())
    }

    /// Wait until `done(word)` for a word in rank `peer`'s segment: spin (or yield) for the
    /// policy's time, then sleep on the futex in slices, checking peers' health between slices.
    pub(crate) fn wait_word(&self, peer: usize, word: &AtomicU32, done: impl Fn(u32) -> bool, what: &dyn Fn() -> String) -> Result<()> {
        if done(word.load(Acquire)) {
            return Ok(());
        }
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if self.spin.yield_while_spinning {
                sys::sched_yield();
            } else {
                std::hint::spin_loop();
            }
            if done(word.load(Acquire)) {
                return Ok(());
            }
            i += 1;
            // Reading the clock costs more than a spin iteration: only every 64th (or every yield).
            if (i.is_multiple_of(64) || self.spin.yield_while_spinning) && start.elapsed() >= self.spin.spin {
                break;
            }
        }
        let seg = &self.segs[peer];
        loop {
            seg.sleepers().fetch_add(1, SeqCst);
            let v = word.load(SeqCst);
            if !done(v) {
                sys::futex_wait(word, v, SLEEP_SLICE);
            }
            seg.sleepers().fetch_sub(1, SeqCst);
            if done(word.load(Acquire)) {
                return Ok(());
            }
            self.check_peers(peer)?;
            if start.elapsed() >= self.timeout {
                return Err(Error::Timeout { what: what(), secs: self.timeout.as_secs_f64() });
            }
        }
    }

    /// A full barrier: bump my phase, wait for every peer's phase to reach it.
    pub(crate) fn sync(&self) -> Result<()> {
        let v = self.bump(self.own().phase());
        // Start with the next rank so waiters spread over peers rather than all polling rank 0.
        for k in 1..self.world {
            let r = (self.rank + k) % self.world;
            self.wait_word(r, self.segs[r].phase(), |x| x.wrapping_sub(v) as i32 >= 0, &|| format!("rank {r} at a sync point"))?;
        }
        Ok(())
    }

    /// Copy `len` bytes at `addr` in rank `r` into `dst`.
    ///
    /// Not marked unsafe, but it writes through `dst`: every caller passes `len` bytes that are
    /// writable and touched by nothing else for the call (its own contract's output, or scratch).
    pub(crate) fn read_from(&self, r: usize, addr: u64, dst: *mut u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the callers' promise above: `dst` is `len` writable bytes that only this call
        // touches (fetch's and Comm::recv_from's outputs, reduce_to_me's scratch block, the Rsag
        // gather's chunk, broadcast_split's front half). The remote side is checked by the kernel.
        unsafe { sys::read_peer(self.pids[r], addr, dst, len) }.map_err(|errno| self.peer_copy_error(r, errno, "process_vm_readv"))?;
        // A peer that gave up (or closed the group) may have returned and reused this memory
        // before or during the copy, and `wait_word`'s fast path does not look at peers. It sets
        // its flag before it returns, so a check after the copy catches every such read.
        self.after_copy(r)
    }

    /// Copy `len` bytes at `src` into `addr` in rank `r`, a range rank r published for this rank to fill.
    ///
    /// Not marked unsafe, but it reads through `src`: its callers (broadcast_split on the root,
    /// rsag) pass `len` bytes of their own buffer, readable for the call.
    ///
    /// This is where a rank writes into a peer's own memory, which the peer's caller frees once
    /// the call returns. A peer returns early only after marking itself aborted or closed (its
    /// final sync timed out, or it failed): then nothing is written. (What stays open: a writer
    /// stalled for the whole timeout between this check and the system call.)
    pub(crate) fn write_to(&self, r: usize, addr: u64, src: *const u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let seg = &self.segs[r];
        if seg.aborted().load(Acquire) != 0 {
            return Err(Error::PeerAborted { rank: self.job_rank(r), reason: seg.reason() });
        }
        // SAFETY: the caller's promise above: `src` is `len` readable bytes. The remote range is
        // part of the buffer rank r published for this rank to fill in this op, as write_peer
        // requires, and rank r has not given up on the op (checked just above).
        unsafe { sys::write_peer(self.pids[r], addr, src, len) }.map_err(|errno| self.peer_copy_error(r, errno, "process_vm_writev"))?;
        // As for reads: a peer that gave up meanwhile did not get these bytes where it wanted them.
        self.after_copy(r)
    }

    /// Fail a copy with rank `r`'s memory if r aborted or closed before it ended (see `read_from`).
    fn after_copy(&self, r: usize) -> Result<()> {
        // Orders the copy's loads before the flag's: a copy that saw memory reused after the
        // abort (which `fail` fences ahead of any later store) sees the flag too. Free on x86.
        fence(Acquire);
        let seg = &self.segs[r];
        // Acquire: the reason, written before the flag, is complete when read.
        if seg.aborted().load(Acquire) != 0 {
            return Err(Error::PeerAborted { rank: self.job_rank(r), reason: seg.reason() });
        }
        Ok(())
    }

    fn peer_copy_error(&self, r: usize, errno: i32, call: &'static str) -> Error {
        if errno == libc::ESRCH {
            Error::PeerDied { rank: self.job_rank(r), pid: self.pids[r] }
        } else {
            // A peer whose buffer vanished under us aborted or died; report that if so.
            self.check_peers(r).err().unwrap_or(Error::Os { call, errno })
        }
    }
}

fn dtype_name(code: u32) -> &'static str {
    crate::dtype::DType::from_code(code).map(|d| d.name()).unwrap_or("?")
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Tell peers the group is gone: one still reading a send this rank never saw taken, or
        // waiting for this rank in an op, fails instead of acking freed memory or timing out.
        // A peer done with every op never looks at the flag (only pending waits and copies do).
        // Only once connected: before that, `net` holds this rank's segment alone.
        if self.broken.is_none() && self.net.segs.len() == self.world {
            self.give_up(&Error::Broken(format!("rank {} closed the group", self.rank)), CLOSED);
        }
        if self.own_fd >= 0 {
            sys::close_fd(self.own_fd);
        }
    }
}
