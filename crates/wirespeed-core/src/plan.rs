//! Which algorithm runs a collective, chosen per message size by a small latency/bandwidth cost
//! model, overridable with WIRESPEED_ALGO. All ranks compute the same choice from the same inputs
//! (size, world, host), and a disagreement is caught by the descriptor check anyway.
//!
//! Two planners, each with its own algorithms: one host (`pick_all_reduce`, `ShmAlgo`) and across
//! hosts (`pick_across_hosts` and `pick_among_leaders`, `NetAlgo`). WIRESPEED_ALGO (config.rs)
//! forces the planner whose algorithm it names (`Tuning::shm_all_reduce` or
//! `Tuning::net_all_reduce`) and leaves the other to its cost model, as `auto` does.
//!
//! all_reduce algorithms (one file's worth each, in shm/collectives.rs):
//! - `oneshot`: every rank copies its input into its staging slot, one sync, then every rank
//!   reduces all slots itself. One sync, (n+1)*S bytes per rank: best for small messages.
//! - `staged`: reduce-scatter then all-gather through the staging slots: copy in, sync, reduce
//!   one chunk of every slot, sync, copy the reduced chunks out. Two syncs, ~3*S bytes per rank
//!   whatever n: best from 3 ranks up while the message fits in the slot.
//! - `rsag`: reduce-scatter then all-gather, reading peers' buffers where they lie with
//!   process_vm_readv. Three syncs and 2(n-1) system calls, ~2*S bytes per rank: for messages
//!   larger than the slot.

/// An all_reduce algorithm of the one-host planner (`Tuning::pick_all_reduce`, run by
/// shm/collectives.rs). The discriminant is what a rank publishes in its op descriptor (`algo`)
/// and what the disagreement message names, so each keeps its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmAlgo {
    OneShot = 1,
    Rsag = 2,
    /// Reduce-scatter + all-gather through the staging slots: no system call, two syncs.
    Staged = 3,
}

/// An all_reduce algorithm of the across-hosts planner (`Tuning::pick_across_hosts` and
/// `Tuning::pick_among_leaders`, run by hosts/). The discriminant goes into every message tag of
/// the all_reduce (its root field, `hosts::op_tag`), so each keeps its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetAlgo {
    /// A flat ring over every rank (what gloo does), ranks placed as launched.
    Ring = 4,
    /// Shm reduce in each host, ring among host leaders over TCP, shm broadcast.
    Hier = 5,
    /// As `Hier`, with recursive doubling among the leaders (a power of two of hosts; otherwise
    /// the ring). The cost model's choice among leaders for small messages.
    Doubling = 6,
}

#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    /// The one-host all_reduce forced by WIRESPEED_ALGO (`oneshot`, `staged`, `rsag`); None: the
    /// cost model chooses. Only the one-host planner reads it.
    pub shm_all_reduce: Option<ShmAlgo>,
    /// The across-hosts all_reduce forced by WIRESPEED_ALGO (`ring`, `hier`, `doubling`); None:
    /// the cost model chooses. Only the across-hosts planner reads it.
    pub net_all_reduce: Option<NetAlgo>,
    /// Size of each of the two staging slots per rank; bounds what can be staged.
    pub slot_bytes: usize,
    /// Exchanges whose send side is at most this many bytes go through the staging slot.
    pub stage_max: usize,
    /// Block size of the large-message reduction (per peer, kept in cache); 0: by the rank
    /// count (`block_for`), what applies unless WIRESPEED_BLOCK_BYTES is set.
    pub block_bytes: usize,
    /// The most a 2-rank exchange or broadcast stages (`WIRESPEED_PAIR_STAGE_MAX`).
    pub pair_stage_max: usize,
    /// Across 3 hosts or more, all_gather and reduce_scatter take the ring from this many bytes
    /// per rank's chunk on (`WIRESPEED_GATHER_RING_MIN`; see `Tuning::gather_on_ring`).
    pub gather_ring_min: usize,
    /// Across hosts, all_to_all goes through the host leaders when no piece anywhere exceeds
    /// this many bytes (`WIRESPEED_A2A_LEADERS_MAX`; see `Tuning::a2a_through_leaders`).
    pub a2a_leaders_max: usize,
}

/// The largest all_to_all piece (bytes from one rank to another) with which all_to_all across
/// hosts goes through the host leaders by default (see `Tuning::a2a_through_leaders`).
pub const A2A_LEADERS_MAX: usize = 16 << 10;

/// The most a 2-rank exchange or broadcast stages by default (see `Tuning::exchange_stages`).
pub const PAIR_STAGE_MAX: usize = 16 << 10;

/// Per-rank chunk from which all_gather and reduce_scatter across 3 hosts or more take the ring
/// by default (see `Tuning::gather_on_ring`).
pub const GATHER_RING_MIN: usize = 64 << 10;

impl Default for Tuning {
    /// The planner's defaults, what it uses where no `WIRESPEED_*` variable is set (config.rs
    /// reads them): the cost model's choice, 1 MiB slots, exchanges staged up to 64 KiB (2 ranks:
    /// `PAIR_STAGE_MAX`), reduction blocks by the rank count (`block_for`).
    fn default() -> Tuning {
        Tuning { shm_all_reduce: None, net_all_reduce: None, slot_bytes: 1 << 20, stage_max: 64 << 10, block_bytes: 0, pair_stage_max: PAIR_STAGE_MAX, gather_ring_min: GATHER_RING_MIN, a2a_leaders_max: A2A_LEADERS_MAX }
    }
}

/// The block of the large-message reduction among 2 ranks (`Tuning::block_for`).
pub const PAIR_BLOCK: usize = 256 << 10;
/// The block among 3 ranks or more.
pub const BLOCK: usize = 64 << 10;

impl Tuning {
    /// The per-peer block of the large-message reduction (shm/collectives/reduce.rs) among
    /// `world` ranks: WIRESPEED_BLOCK_BYTES where set, else 256 KiB for 2 ranks and 64 KiB from
    /// 3. Each block is one process_vm_readv and one process_vm_writev per peer, and each call
    /// costs ~1.6 us on top of its bytes here (the kernel's lookup of the peer and its ptrace
    /// check, which an LSM hook lengthens on this VM): a 2-rank 1 MiB all_reduce went from 126-139
    /// to 107-110 us (Open MPI 103-111 us in the same runs) and 4 MiB from 520-755 to 463-507 us
    /// with 256 KiB blocks (docs/small-messages.md). The blocks must stay in the core's cache
    /// with the ones they are reduced with (world x block of scratch): 2 x 260 KiB fits a 1 MiB
    /// L2; from 3 ranks the 64 KiB block stays until it is measured there.
    pub fn block_for(&self, world: usize) -> usize {
        match self.block_bytes {
            0 if world <= 2 => PAIR_BLOCK,
            0 => BLOCK,
            b => b,
        }
    }

    /// The one-host all_reduce algorithm for `bytes` per rank among `world` ranks on `cpus`
    /// cores: the forced one (`shm_all_reduce`) where it can run, `Rsag` for what exceeds the
    /// slot, else the cost model's choice.
    pub fn pick_all_reduce(&self, bytes: usize, world: usize, cpus: usize) -> ShmAlgo {
        let fits = bytes <= self.slot_bytes;
        match self.shm_all_reduce {
            Some(ShmAlgo::OneShot) if fits => return ShmAlgo::OneShot,
            Some(ShmAlgo::Staged) if fits => return ShmAlgo::Staged,
            Some(ShmAlgo::Rsag | ShmAlgo::OneShot | ShmAlgo::Staged) => return ShmAlgo::Rsag,
            None => {}
        }
        if !fits {
            return ShmAlgo::Rsag;
        }
        let (oneshot, staged, rsag) = cost_us(bytes as f64, world as f64, cpus as f64, self.block_for(world) as f64);
        // More ranks than cores: rsag's system calls, each pinning the peer's pages, are CPU time
        // the ranks queue for, which the model's stretch does not capture; staged moves the same
        // bytes with plain copies. Measured on 2 cores (docs/small-messages.md, 2026-11-29):
        // staged 1.2-3x faster than rsag at 64 KiB-1 MiB on 4 and 8 ranks.
        let rsag = if world > cpus { f64::INFINITY } else { rsag };
        if oneshot <= staged && oneshot <= rsag {
            ShmAlgo::OneShot
        } else if staged <= rsag {
            ShmAlgo::Staged
        } else {
            ShmAlgo::Rsag
        }
    }

    /// Whether a one-host exchange (all_gather, all_to_all, gather, scatter) whose send side
    /// totals `bytes` goes through the sender's slot rather than being read where it lies.
    /// Staging costs a second copy and saves the system call (~3 us). Between 2 ranks the direct
    /// read is a single copy, and staging stops paying from about 32 KiB, so 2-rank exchanges
    /// stage at most `pair_stage_max` (default `PAIR_STAGE_MAX`; the measurements are in
    /// docs/small-messages.md). From 3 ranks, n-1 readers of one slot beat n-1 process_vm_readv
    /// calls pinning the same pages, up to `stage_max`.
    pub fn exchange_stages(&self, bytes: usize, world: usize) -> bool {
        let max = if world == 2 { self.stage_max.min(self.pair_stage_max) } else { self.stage_max };
        bytes <= max.min(self.slot_bytes)
    }

    /// Whether a one-host broadcast of `bytes` among `world` ranks goes through the root's slot.
    /// Small ones always do (as `exchange_stages`). Up to the slot's size they do from 3 ranks on
    /// as well: the root copies once and every reader loads from its slot at once, where n-1
    /// process_vm_readv calls would all pin the root's pages (on 4 ranks, 1 MiB: 177 us staged
    /// against 284 us direct). With 2 ranks the direct read is a single copy against two, so it
    /// stays direct (256 KiB: 34 us direct, 83 us staged).
    pub fn broadcast_stages(&self, bytes: usize, world: usize) -> bool {
        self.exchange_stages(bytes, world) || (world >= 3 && bytes <= self.slot_bytes)
    }

    /// Whether an all_gather or reduce_scatter across `hosts` hosts, `bytes` per rank's chunk,
    /// runs on the ring (algo/ring.rs) rather than as a direct exchange (algo/direct.rs). Both
    /// put the same bytes on each link, but the direct exchange has every rank send to all
    /// others at once: on 4 hosts at 1 Gbit/s each rank then fed 25 TCP streams into its link
    /// (12 to each ring neighbour, 1 to the rest), overflowing its queue (~1,500 drops per host
    /// per run), and the lone stream to the far host, starved while the 24 others ran, was left
    /// to finish alone: 16 MiB took 290 ms where the link allows 100 (0.34 of the link; gloo's
    /// ring 0.79). The ring sends only to the next rank, over its full stream count. On 2 hosts
    /// the two are the same exchange, and small chunks are latency-bound, where the direct
    /// exchange's one round beats the ring's k-1 steps: both stay direct.
    pub fn gather_on_ring(&self, bytes: usize, hosts: usize) -> bool {
        hosts >= 3 && bytes >= self.gather_ring_min
    }

    /// Whether an all_to_all across `hosts` hosts whose largest piece (over every rank: the
    /// ranks agree on it first, hosts/group.rs) is `largest` bytes goes through the host leaders
    /// (algo/leaders_a2a.rs) rather than the direct exchange (algo/direct.rs). Through the
    /// leaders a rank talks to its leader only and a leader to 2 ceil(log2 H) others, where the
    /// direct exchange connects every pair of ranks (at 64 hosts x 8 ranks, 504 remote peers a
    /// rank) and sends n-1 messages a rank. The price is bytes: Bruck's rounds carry each piece
    /// about log2(H)/2 times between leaders, and every piece crosses the leaders' shared memory
    /// twice, so large pieces, whose data is pairwise anyway, stay direct. The default (16 KiB)
    /// is not measured yet: it keeps the rehearsal's all_to_all (4 and 64 KiB a rank in all)
    /// on the leaders from 4 ranks up.
    pub fn a2a_through_leaders(&self, largest: usize, hosts: usize) -> bool {
        hosts >= 2 && largest <= self.a2a_leaders_max
    }

    /// The all_reduce algorithm across `hosts` hosts for `bytes` per rank among `world` ranks:
    /// `Ring` or `Hier`. A forced `ring` or `hier` is obeyed (`doubling` is a kind of `hier`);
    /// None (`net_all_reduce`) lets the cost model choose.
    pub fn pick_across_hosts(&self, bytes: usize, world: usize, hosts: usize) -> NetAlgo {
        match self.net_all_reduce {
            Some(NetAlgo::Ring) => NetAlgo::Ring,
            Some(NetAlgo::Hier | NetAlgo::Doubling) => NetAlgo::Hier,
            None => {
                let (hier, ring) = cost_across_hosts_us(bytes as f64, world as f64, hosts as f64);
                if hier <= ring { NetAlgo::Hier } else { NetAlgo::Ring }
            }
        }
    }

    /// The all_reduce among `leaders` host leaders (inside `hier`) for `bytes` per rank: `Ring`
    /// or `Doubling` (only for a power of two of leaders). A forced `doubling` is obeyed where it
    /// can run, a forced `hier` (or `ring`) takes the ring; None lets the cost model choose.
    pub fn pick_among_leaders(&self, bytes: usize, leaders: usize) -> NetAlgo {
        if leaders < 2 || !leaders.is_power_of_two() {
            return NetAlgo::Ring;
        }
        match self.net_all_reduce {
            Some(NetAlgo::Doubling) => NetAlgo::Doubling,
            Some(NetAlgo::Hier | NetAlgo::Ring) => NetAlgo::Ring,
            None if bytes > DOUBLING_MAX => NetAlgo::Ring,
            None => {
                let (doubling, ring) = cost_among_leaders_us(bytes as f64, leaders as f64);
                if doubling < ring { NetAlgo::Doubling } else { NetAlgo::Ring }
            }
        }
    }
}

/// Largest message recursive doubling takes: it holds a whole-buffer scratch and reduces only once
/// a whole buffer has arrived, where the ring's slices bound the scratch and overlap the reduction
/// with the link. (On 2 hosts the model alone would pick doubling at any size: same bytes, one
/// message fewer.)
const DOUBLING_MAX: usize = 256 << 10;

/// Estimated microseconds of (recursive doubling, ring) among `h` host leaders for `s` bytes,
/// with the link constants of `cost_across_hosts_us`: doubling sends all of S in each of log2(h)
/// rounds; the ring sends 2(h-1) messages carrying 2·S·(h-1)/h in all. Doubling wins below
/// ~50 KB on 8 hosts, ~75 KB on 4, and at every size on 2.
pub fn cost_among_leaders_us(s: f64, h: f64) -> (f64, f64) {
    let link = 117.0;
    let msg = 50.0;
    let doubling = h.log2() * (msg + s / link);
    let ring = 2.0 * (h - 1.0) * msg + 2.0 * s * (h - 1.0) / h / link;
    (doubling, ring)
}

/// Estimated microseconds of (hier, ring) all_reduce across hosts, ranks spread evenly (L = n/H
/// per host) and placed round robin (the ring's worst and gloo's usual case). Links: ~117 MB/s
/// each way (1 Gbit/s Ethernet under TCP) and ~50 us per message; shm passes ~10 GB/s.
/// - hier: each link carries 2·S·(H-1)/H each way in 2(H-1) steps, plus an shm reduce and
///   broadcast of S when L > 1.
/// - ring: every rank sends 2·S·(n-1)/n in 2(n-1) steps and the L ranks of a host share its
///   link, so a link carries L times a rank's share.
///
/// With L = 1 both are the same ring; with L > 1 the ring puts about L times more bytes on each
/// link, which is ~100x slower than memory: hier wins at every size.
pub fn cost_across_hosts_us(s: f64, n: f64, h: f64) -> (f64, f64) {
    let link = 117.0; // bytes per us
    let msg = 50.0;
    let mem = 10_000.0;
    let l = (n / h).max(1.0);
    let local = if l > 1.0 { 2.0 * (2.0 * s / mem + 4.0) } else { 0.0 };
    let hier = local + 2.0 * (h - 1.0) * msg + 2.0 * s * (h - 1.0) / h / link;
    let ring = 2.0 * (n - 1.0) * msg + l * 2.0 * s * (n - 1.0) / n / link;
    (hier, ring)
}

/// Estimated microseconds of (oneshot, staged, rsag) for `s` bytes per rank among `n` ranks on
/// `cpus` cores, rsag reading and writing in blocks of `block` bytes. Constants measured first on
/// a development VM of 2 vCPUs of an AMD EPYC (KVM) with `cargo run --release --example shm_costs`
/// and the C probes described in docs/small-messages.md, rsag's again on 2 vCPUs of an Intel Xeon
/// after its write-back (2026-11-26, `WIRESPEED_ALGO=... wirespeed bench -c all_reduce`, 16 KiB to
/// 1 MiB at 2, 4 and 8 ranks: docs/small-messages.md):
/// - reading data another core just wrote: ~10 GB/s (10-13 measured from 64 KiB to 1 MiB); a copy
///   within one core's cache: ~30 GB/s; process_vm_readv/writev between processes ~1.5 us per
///   call, and ~15 GB/s for blocks whose other end is in this core's cache (rsag's reads land in
///   a cache-resident scratch, its writes come from the block it just reduced);
/// - a sync point: ~2 us when every rank has a core; when ranks outnumber cores, each sync waits
///   for the others' time slices, ~3 us per rank per core (barrier: 6.2 us at 4 ranks on 2 cores,
///   12.2 us at 8), and every byte term stretches by n/cpus, the cores being shared.
///
/// - oneshot: one sync; copy S in, read (n-1)·S from peers' slots while reducing.
/// - staged: two syncs; copy S in, read (n-1)/n·S of peers' slots reducing, as much again copying
///   the reduced chunks out. Ties with oneshot at 2 ranks (same bytes, one sync more), wins above a
///   few KiB from 3 ranks up.
/// - rsag: two syncs; per block of a rank's chunk, n-1 reads and n-1 writes (system calls) moving
///   2·S·(n-1)/n in all; no slot room needed, so it also takes what does not fit in the slot.
///   Measured it wins from ~16 KiB at 2 ranks, ~128 KiB at 4 and ~256 KiB at 8 (2 cores); the
///   model, with its per-call cost, moves over later (~75 KiB, ~110 KiB, ~256 KiB).
pub fn cost_us(s: f64, n: f64, cpus: f64, block: f64) -> (f64, f64, f64) {
    let cross = 10_000.0; // bytes per us
    let local = 30_000.0;
    let cma = 15_000.0;
    let call = 1.5;
    let (sync, stretch) = if n > cpus { (3.0 * n / cpus, n / cpus) } else { (2.0, 1.0) };
    let oneshot = sync + stretch * (s / local + (n - 1.0) * s / cross);
    let staged = 2.0 * sync + stretch * (s / local + 2.0 * (n - 1.0) / n * s / cross);
    let blocks = (s / n / block.max(1.0)).ceil().max(1.0);
    let rsag = 2.0 * sync + stretch * (2.0 * (n - 1.0) * blocks * call + 2.0 * (n - 1.0) / n * s / cma);
    (oneshot, staged, rsag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_take_oneshot_large_take_rsag() {
        let t = Tuning { shm_all_reduce: None, net_all_reduce: None, slot_bytes: 1 << 20, stage_max: 1 << 16, block_bytes: 1 << 16, pair_stage_max: PAIR_STAGE_MAX, gather_ring_min: GATHER_RING_MIN, a2a_leaders_max: A2A_LEADERS_MAX };
        assert_eq!(t.pick_all_reduce(4096, 2, 2), ShmAlgo::OneShot);
        assert_eq!(t.pick_all_reduce(4096, 4, 2), ShmAlgo::OneShot);
        // Two ranks: oneshot while its one sync is most of the cost; rsag once the bytes are
        // (it moves half of them each way, with both ends of each copy in cache).
        assert_eq!(t.pick_all_reduce(16 << 10, 2, 2), ShmAlgo::OneShot);
        assert_eq!(t.pick_all_reduce(128 << 10, 2, 2), ShmAlgo::Rsag);
        assert_eq!(t.pick_all_reduce(1 << 20, 2, 2), ShmAlgo::Rsag);
        assert_eq!(t.pick_all_reduce(1 << 20, 2, 16), ShmAlgo::Rsag);
        // More ranks: oneshot reads (n-1)·S, staged about 2·S: staged from a few KiB on, until
        // rsag's system calls are paid for by its cache-hot copies.
        assert_eq!(t.pick_all_reduce(64 << 10, 4, 2), ShmAlgo::Staged);
        // More ranks than cores: staged up to the slot (rsag's pinning is CPU time they queue for).
        assert_eq!(t.pick_all_reduce(256 << 10, 4, 2), ShmAlgo::Staged);
        assert_eq!(t.pick_all_reduce(1 << 20, 4, 2), ShmAlgo::Staged);
        assert_eq!(t.pick_all_reduce(16 << 10, 8, 16), ShmAlgo::Staged);
        assert_eq!(t.pick_all_reduce(64 << 10, 8, 2), ShmAlgo::Staged);
        assert_eq!(t.pick_all_reduce(1 << 20, 8, 2), ShmAlgo::Staged);
        // As many cores as ranks: rsag once its cache-hot copies pay for its system calls.
        assert_eq!(t.pick_all_reduce(1 << 20, 4, 4), ShmAlgo::Rsag);
        assert_eq!(t.pick_all_reduce(1 << 20, 8, 16), ShmAlgo::Rsag);
        // Beyond the slot only the direct reads remain.
        assert_eq!(t.pick_all_reduce((1 << 20) + 64, 2, 2), ShmAlgo::Rsag);
        assert_eq!(t.pick_all_reduce(64 << 20, 2, 2), ShmAlgo::Rsag);
        let forced = Tuning { shm_all_reduce: Some(ShmAlgo::OneShot), ..t };
        assert_eq!(forced.pick_all_reduce(4 << 20, 2, 2), ShmAlgo::Rsag, "oneshot cannot exceed the slot");
        assert!(t.broadcast_stages(16 << 10, 2) && !t.broadcast_stages(32 << 10, 2));
        assert!(t.exchange_stages(64 << 10, 3) && !t.exchange_stages((64 << 10) + 1, 3));
        assert!(t.exchange_stages(16 << 10, 2) && !t.exchange_stages((16 << 10) + 1, 2));
        assert!(t.broadcast_stages(1 << 20, 3) && !t.broadcast_stages((1 << 20) + 1, 8));
        let staged = Tuning { shm_all_reduce: Some(ShmAlgo::Staged), ..t };
        assert_eq!(staged.pick_all_reduce(4096, 2, 2), ShmAlgo::Staged);
        assert_eq!(staged.pick_all_reduce(4 << 20, 2, 2), ShmAlgo::Rsag, "staged cannot exceed the slot");
    }

    #[test]
    fn across_hosts_hier_unless_ring_is_forced() {
        let t = Tuning { shm_all_reduce: None, net_all_reduce: None, slot_bytes: 1 << 20, stage_max: 1 << 16, block_bytes: 1 << 16, pair_stage_max: PAIR_STAGE_MAX, gather_ring_min: GATHER_RING_MIN, a2a_leaders_max: A2A_LEADERS_MAX };
        for &(n, h) in &[(2usize, 2usize), (4, 2), (8, 2), (8, 4), (16, 4)] {
            for &s in &[0usize, 4096, 1 << 20, 64 << 20] {
                assert_eq!(t.pick_across_hosts(s, n, h), NetAlgo::Hier, "n {n} h {h} s {s}");
            }
        }
        // With one rank per host the two are the same ring: equal cost.
        let (hier, ring) = cost_across_hosts_us((64 << 20) as f64, 4.0, 4.0);
        assert!((hier - ring).abs() < 1e-6);
        let forced = Tuning { net_all_reduce: Some(NetAlgo::Ring), ..t };
        assert_eq!(forced.pick_across_hosts(64 << 20, 4, 2), NetAlgo::Ring);
        // Among leaders: doubling for small messages on a power of two of hosts, else the ring.
        assert_eq!(t.pick_among_leaders(4096, 2), NetAlgo::Doubling);
        assert_eq!(t.pick_among_leaders(4096, 8), NetAlgo::Doubling);
        assert_eq!(t.pick_among_leaders(4096, 3), NetAlgo::Ring);
        assert_eq!(t.pick_among_leaders(1 << 20, 2), NetAlgo::Ring);
        assert_eq!(t.pick_among_leaders(200 << 10, 8), NetAlgo::Ring, "the model's crossover");
        let doubling = Tuning { net_all_reduce: Some(NetAlgo::Doubling), ..t };
        assert_eq!(doubling.pick_across_hosts(64 << 20, 4, 2), NetAlgo::Hier);
        assert_eq!(doubling.pick_among_leaders(64 << 20, 4), NetAlgo::Doubling);
        assert_eq!(doubling.pick_among_leaders(64, 3), NetAlgo::Ring);
        let hier = Tuning { net_all_reduce: Some(NetAlgo::Hier), ..t };
        assert_eq!(hier.pick_among_leaders(64, 2), NetAlgo::Ring);
        assert_eq!(forced.pick_all_reduce(64 << 20, 4, 2), ShmAlgo::Rsag, "one host ignores ring");
    }

    #[test]
    fn gathers_take_the_ring_across_three_hosts_or_more_from_the_threshold() {
        let t = Tuning::default();
        assert!(!t.gather_on_ring(64 << 20, 2), "2 hosts: the ring is the direct exchange");
        assert!(!t.gather_on_ring(GATHER_RING_MIN - 1, 8), "small chunks stay direct");
        assert!(t.gather_on_ring(GATHER_RING_MIN, 3) && t.gather_on_ring(64 << 20, 8));
        let never = Tuning { gather_ring_min: usize::MAX, ..t };
        assert!(!never.gather_on_ring(64 << 20, 8));
    }

    #[test]
    fn algorithm_numbers_are_those_on_the_wire() {
        // The shm op descriptor carries a ShmAlgo, a cross-host all_reduce's tags a NetAlgo.
        assert_eq!([ShmAlgo::OneShot as u32, ShmAlgo::Rsag as u32, ShmAlgo::Staged as u32], [1, 2, 3]);
        assert_eq!([NetAlgo::Ring as u32, NetAlgo::Hier as u32, NetAlgo::Doubling as u32], [4, 5, 6]);
    }
}
