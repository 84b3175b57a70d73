//! Which algorithm runs a collective, chosen per message size by a small latency/bandwidth cost
//! model, overridable with WIRESPEED_ALGO. All ranks compute the same choice from the same inputs
//! (size, world, host), and a disagreement is caught by the descriptor check anyway.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceAlgo {
    Auto,
    OneShot,
    Rsag,
    /// Reduce-scatter + all-gather through the staging slots: no system call, two syncs.
    Staged,
    /// Across hosts: a flat ring over every rank (what gloo does), ranks placed as launched.
    Ring,
    /// Across hosts: shm reduce in each host, ring among host leaders over TCP, shm broadcast.
    Hier,
    /// Across hosts: as `Hier`, with recursive doubling among the leaders (a power of two of
    /// hosts; otherwise the ring). The cost model's choice for small messages.
    Doubling,
}

#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub all_reduce: AllReduceAlgo,
    /// Size of each of the two staging slots per rank; bounds what can be staged.
    pub slot_bytes: usize,
    /// Exchanges whose send side is at most this many bytes go through the staging slot.
    pub stage_max: usize,
    /// Block size of the large-message reduction (per peer, kept in cache).
    pub block_bytes: usize,
    /// The most a 2-rank exchange or broadcast stages (`WIRESPEED_PAIR_STAGE_MAX`).
    pub pair_stage_max: usize,
}

/// The most a 2-rank exchange or broadcast stages by default (see `Tuning::exchange_stages`).
pub const PAIR_STAGE_MAX: usize = 16 << 10;

impl Default for Tuning {
    /// The planner's defaults, what it uses where no `WIRESPEED_*` variable is set (config.rs
    /// reads them): the cost model's choice, 1 MiB slots, exchanges staged up to 64 KiB (2 ranks:
    /// `PAIR_STAGE_MAX`), 64 KiB reduction blocks.
    fn default() -> Tuning {
        Tuning { all_reduce: AllReduceAlgo::Auto, slot_bytes: 1 << 20, stage_max: 64 << 10, block_bytes: 64 << 10, pair_stage_max: PAIR_STAGE_MAX }
    }
}

impl Tuning {
    /// The all_reduce algorithm for `bytes` per rank among `world` ranks on `cpus` cores.
    pub fn pick_all_reduce(&self, bytes: usize, world: usize, cpus: usize) -> AllReduceAlgo {
        let fits = bytes <= self.slot_bytes;
        match self.all_reduce {
            AllReduceAlgo::OneShot if fits => return AllReduceAlgo::OneShot,
            AllReduceAlgo::Staged if fits => return AllReduceAlgo::Staged,
            AllReduceAlgo::Rsag | AllReduceAlgo::OneShot | AllReduceAlgo::Staged => return AllReduceAlgo::Rsag,
            // The cross-host algorithms name no shm algorithm: choose as auto does.
            AllReduceAlgo::Auto | AllReduceAlgo::Ring | AllReduceAlgo::Hier | AllReduceAlgo::Doubling => {}
        }
        if !fits {
            return AllReduceAlgo::Rsag;
        }
        let (oneshot, staged, rsag) = cost_us(bytes as f64, world as f64, cpus as f64);
        if oneshot <= staged && oneshot <= rsag {
            AllReduceAlgo::OneShot
        } else if staged <= rsag {
            AllReduceAlgo::Staged
        } else {
            AllReduceAlgo::Rsag
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

    /// The all_reduce algorithm across `hosts` hosts for `bytes` per rank among `world` ranks.
    /// `ring` and `hier` are obeyed (`doubling` is a kind of `hier`); `oneshot`/`rsag` name shm
    /// algorithms, so they choose as auto.
    pub fn pick_across_hosts(&self, bytes: usize, world: usize, hosts: usize) -> AllReduceAlgo {
        match self.all_reduce {
            AllReduceAlgo::Ring => AllReduceAlgo::Ring,
            AllReduceAlgo::Hier | AllReduceAlgo::Doubling => AllReduceAlgo::Hier,
            _ => {
                let (hier, ring) = cost_across_hosts_us(bytes as f64, world as f64, hosts as f64);
                if hier <= ring { AllReduceAlgo::Hier } else { AllReduceAlgo::Ring }
            }
        }
    }

    /// The all_reduce among `leaders` host leaders (inside `hier`) for `bytes` per rank: `Ring`
    /// or `Doubling` (only for a power of two of leaders).
    pub fn pick_among_leaders(&self, bytes: usize, leaders: usize) -> AllReduceAlgo {
        if leaders < 2 || !leaders.is_power_of_two() {
            return AllReduceAlgo::Ring;
        }
        match self.all_reduce {
            AllReduceAlgo::Doubling => AllReduceAlgo::Doubling,
            AllReduceAlgo::Hier | AllReduceAlgo::Ring => AllReduceAlgo::Ring,
            _ if bytes > DOUBLING_MAX => AllReduceAlgo::Ring,
            _ => {
                let (doubling, ring) = cost_among_leaders_us(bytes as f64, leaders as f64);
                if doubling < ring { AllReduceAlgo::Doubling } else { AllReduceAlgo::Ring }
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
/// `cpus` cores. Constants measured on the development VM (2 vCPUs of an AMD EPYC, KVM) with
/// `cargo run --release --example shm_costs` and the C probes described in docs/small-messages.md:
/// - reading data another core just wrote: ~10 GB/s (10-13 measured from 64 KiB to 1 MiB); a copy
///   within one core's cache: ~30 GB/s; process_vm_readv between processes: ~5 GB/s effective
///   (page pinning on top of the copy) and ~1.5 us per call;
/// - a sync point: ~2 us when every rank has a core; when ranks outnumber cores, each sync waits
///   for the others' time slices, ~3 us per rank per core (barrier: 6.2 us at 4 ranks on 2 cores,
///   12.2 us at 8), and every byte term stretches by n/cpus, the cores being shared.
///
/// - oneshot: one sync; copy S in, read (n-1)·S from peers' slots while reducing.
/// - staged: two syncs; copy S in, read (n-1)/n·S of peers' slots reducing, as much again copying
///   the reduced chunks out. Ties with oneshot at 2 ranks (same bytes, one sync more), wins above a
///   few KiB from 3 ranks up.
/// - rsag: three syncs, 2(n-1) process_vm_readv calls moving 2·S·(n-1)/n: needs no slot room, so it
///   takes what does not fit in the slot.
pub fn cost_us(s: f64, n: f64, cpus: f64) -> (f64, f64, f64) {
    let cross = 10_000.0; // bytes per us
    let local = 30_000.0;
    let cma = 5_000.0;
    let call = 1.5;
    let (sync, stretch) = if n > cpus { (3.0 * n / cpus, n / cpus) } else { (2.0, 1.0) };
    let oneshot = sync + stretch * (s / local + (n - 1.0) * s / cross);
    let staged = 2.0 * sync + stretch * (s / local + 2.0 * (n - 1.0) / n * s / cross);
    let rsag = 3.0 * sync + 2.0 * (n - 1.0) * call + stretch * 2.0 * (n - 1.0) / n * s / cma;
    (oneshot, staged, rsag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_take_oneshot_large_take_rsag() {
        let t = Tuning { all_reduce: AllReduceAlgo::Auto, slot_bytes: 1 << 20, stage_max: 1 << 16, block_bytes: 1 << 16, pair_stage_max: PAIR_STAGE_MAX };
        assert_eq!(t.pick_all_reduce(4096, 2, 2), AllReduceAlgo::OneShot);
        assert_eq!(t.pick_all_reduce(4096, 4, 2), AllReduceAlgo::OneShot);
        // Two ranks: the same bytes either way, oneshot has one sync fewer, up to the slot's size.
        assert_eq!(t.pick_all_reduce(1 << 20, 2, 2), AllReduceAlgo::OneShot);
        assert_eq!(t.pick_all_reduce(1 << 20, 2, 16), AllReduceAlgo::OneShot);
        // More ranks: oneshot reads (n-1)·S, staged about 2·S: staged from a few KiB on.
        assert_eq!(t.pick_all_reduce(64 << 10, 4, 2), AllReduceAlgo::Staged);
        assert_eq!(t.pick_all_reduce(1 << 20, 4, 2), AllReduceAlgo::Staged);
        assert_eq!(t.pick_all_reduce(16 << 10, 8, 16), AllReduceAlgo::Staged);
        assert_eq!(t.pick_all_reduce(1 << 20, 8, 2), AllReduceAlgo::Staged);
        // Beyond the slot only the direct reads remain.
        assert_eq!(t.pick_all_reduce((1 << 20) + 64, 2, 2), AllReduceAlgo::Rsag);
        assert_eq!(t.pick_all_reduce(64 << 20, 2, 2), AllReduceAlgo::Rsag);
        let forced = Tuning { all_reduce: AllReduceAlgo::OneShot, ..t };
        assert_eq!(forced.pick_all_reduce(4 << 20, 2, 2), AllReduceAlgo::Rsag, "oneshot cannot exceed the slot");
        assert!(t.broadcast_stages(16 << 10, 2) && !t.broadcast_stages(32 << 10, 2));
        assert!(t.exchange_stages(64 << 10, 3) && !t.exchange_stages((64 << 10) + 1, 3));
        assert!(t.exchange_stages(16 << 10, 2) && !t.exchange_stages((16 << 10) + 1, 2));
        assert!(t.broadcast_stages(1 << 20, 3) && !t.broadcast_stages((1 << 20) + 1, 8));
        let staged = Tuning { all_reduce: AllReduceAlgo::Staged, ..t };
        assert_eq!(staged.pick_all_reduce(4096, 2, 2), AllReduceAlgo::Staged);
        assert_eq!(staged.pick_all_reduce(4 << 20, 2, 2), AllReduceAlgo::Rsag, "staged cannot exceed the slot");
    }

    #[test]
    fn across_hosts_hier_unless_ring_is_forced() {
        let t = Tuning { all_reduce: AllReduceAlgo::Auto, slot_bytes: 1 << 20, stage_max: 1 << 16, block_bytes: 1 << 16, pair_stage_max: PAIR_STAGE_MAX };
        for &(n, h) in &[(2usize, 2usize), (4, 2), (8, 2), (8, 4), (16, 4)] {
            for &s in &[0usize, 4096, 1 << 20, 64 << 20] {
                assert_eq!(t.pick_across_hosts(s, n, h), AllReduceAlgo::Hier, "n {n} h {h} s {s}");
            }
        }
        // With one rank per host the two are the same ring: equal cost.
        let (hier, ring) = cost_across_hosts_us((64 << 20) as f64, 4.0, 4.0);
        assert!((hier - ring).abs() < 1e-6);
        let forced = Tuning { all_reduce: AllReduceAlgo::Ring, ..t };
        assert_eq!(forced.pick_across_hosts(64 << 20, 4, 2), AllReduceAlgo::Ring);
        // Among leaders: doubling for small messages on a power of two of hosts, else the ring.
        assert_eq!(t.pick_among_leaders(4096, 2), AllReduceAlgo::Doubling);
        assert_eq!(t.pick_among_leaders(4096, 8), AllReduceAlgo::Doubling);
        assert_eq!(t.pick_among_leaders(4096, 3), AllReduceAlgo::Ring);
        assert_eq!(t.pick_among_leaders(1 << 20, 2), AllReduceAlgo::Ring);
        assert_eq!(t.pick_among_leaders(200 << 10, 8), AllReduceAlgo::Ring, "the model's crossover");
        let doubling = Tuning { all_reduce: AllReduceAlgo::Doubling, ..t };
        assert_eq!(doubling.pick_across_hosts(64 << 20, 4, 2), AllReduceAlgo::Hier);
        assert_eq!(doubling.pick_among_leaders(64 << 20, 4), AllReduceAlgo::Doubling);
        assert_eq!(doubling.pick_among_leaders(64, 3), AllReduceAlgo::Ring);
        let hier = Tuning { all_reduce: AllReduceAlgo::Hier, ..t };
        assert_eq!(hier.pick_among_leaders(64, 2), AllReduceAlgo::Ring);
        assert_eq!(forced.pick_all_reduce(64 << 20, 4, 2), AllReduceAlgo::Rsag, "one host ignores ring");
    }
}
