//! File descriptors as a budget. A rank of a multi-host group opens a TCP socket per stream to
//! every rank on another host (`HostLayout::pair_streams`), a listening socket, a pidfd per peer on
//! its host, and the reactor's descriptors; at 1,024 hosts x 8 ranks and 12 streams that is about
//! 20,000, where the usual soft limit is 1,024. A process that meets its limit halfway through
//! dialling fails with EMFILE on one rank and leaves the others to time out. So before anything
//! is opened every rank works out what each rank of the group needs, and:
//! - when its own need is above its soft limit, raises the soft limit to the hard one (as network
//!   daemons do at start: the hard limit is the administrator's ceiling, the soft one a default
//!   kept low for programs that use select());
//! - when some rank's hard limit is below its need at WIRESPEED_NSTREAMS, gives the bandwidth
//!   pairs fewer streams: as many as the tightest rank can hold (the pairs of one stream stay so);
//! - when even one stream per pair does not fit some rank, fails on every rank with one line that
//!   names that rank's need, its limit and the fix.
//!
//! Agreement. The stream count of a pair is in the hello of each of its streams (mesh.rs) and
//! decides how messages are cut, so both ends must use the same one, and ranks that disagreed
//! would refuse each other's connections and time out. So the decision is made only from data
//! every rank holds identically: the layout (from the host ids in the store) and every rank's
//! `FdRoom` (its WIRESPEED_NSTREAMS, hard limit and descriptors held), which each rank publishes
//! beside its host id (python/wirespeed/native/rendezvous.py). Every rank runs `plan` on the
//! same input and reaches the same stream count, or the same error, with no exchange of its own
//! (the rooms travel with the host ids); ranks whose WIRESPEED_NSTREAMS differ fail alike
//! (`Mismatch`) before anything is dialled.
//!
//! What a rank counts for itself (`Need`), beside what it already holds:
//! - its sockets: nstreams to each counterpart on another host and to each rank-order
//!   neighbour on another host, one to every other remote rank;
//! - its listener (1), a pidfd per other rank of its host, its own memfd (open until connected)
//!   and a peer's segment file while it is being mapped (2);
//! - `MARGIN` for the rest of the process (below).
//!
//! The reactor's descriptors (3 per I/O thread: an epoll, its duplicate for registering, an
//! eventfd) are counted by each rank in what it holds (`FdRoom::here`), since its I/O thread count
//! is its own knob; a group after the first counts them again (3 to 6 too many at the default
//! thread count).
use super::layout::HostLayout;
use crate::error::{Error, Result};
use crate::transport::tcp::NetConfig;

/// Descriptors kept free for the rest of the process: what it opens after the group is set up,
/// and what setup itself opens for a moment. A bench rank opens 2-3 files after setup (records,
/// CSV, a plot) and holds 5 before it (stdio, the store's socket; rank 0, serving the store,
/// about 15 more: those count in what it holds). A training process adds a DataLoader (each
/// worker holds a pipe pair and its queues' fds: ~4), checkpoints and logs, and a connection or
/// two that a port scan makes to the listener while setup vets it. 64 holds a DataLoader of 8
/// workers plus those. In a tiny job it is most of the need, which costs nothing; at scale it is
/// lost among the sockets. It does not hold a second full-mesh library (gloo) started after this
/// group; one started before is in what the rank holds.
pub const MARGIN: u64 = 64;

/// What one rank brings to the budget; published through the store as text (`to_text`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdRoom {
    /// WIRESPEED_NSTREAMS as this rank reads it; 0 where its TCP knobs are invalid (that rank
    /// then fails on its own error, and every other rank on the disagreement).
    pub nstreams: usize,
    /// Its hard open-file limit, capped at fs.nr_open: the most its soft limit can be raised to.
    pub limit: u64,
    /// Descriptors open when it measured, plus its reactor's.
    pub held: u64,
}

impl FdRoom {
    /// This process's room, from the TCP engine's knobs (`net`; an error gives nstreams 0).
    pub fn here(net: &Result<NetConfig>) -> Result<FdRoom> {
        let (_, hard) = crate::sys::nofile_limits()?;
        let limit = crate::sys::nr_open().map_or(hard, |n| hard.min(n));
        let (nstreams, io) = match net {
            Ok(n) => (n.nstreams, n.io_threads.max(1)),
            Err(_) => (0, 0),
        };
        Ok(FdRoom { nstreams, limit, held: crate::sys::open_fds()? + 3 * io as u64 })
    }

    pub fn to_text(&self) -> String {
        format!("{}:{}:{}", self.nstreams, self.limit, self.held)
    }

    /// Rank `rank`'s room as `to_text` wrote it.
    pub fn parse(text: &str, rank: usize) -> Result<FdRoom> {
        let v: Vec<u64> = text.split(':').filter_map(|x| x.parse().ok()).collect();
        match v[..] {
            [n, limit, held] if text.split(':').count() == 3 => Ok(FdRoom { nstreams: n as usize, limit, held }),
            _ => Err(Error::Unsupported(format!(
                "rank {rank} published {text:?} as its open-file room, not streams:limit:held (a rank of another wirespeed version?)"
            ))),
        }
    }
}

/// What rank r opens for the group, beside what it holds: `full` pairs of `s` streams, `single`
/// pairs of one, and `fixed` others (listener, pidfds, setup's own, `MARGIN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub full: u64,
    pub single: u64,
    pub fixed: u64,
}

impl Need {
    /// Descriptors at `s` streams per bandwidth pair.
    pub fn at(&self, s: usize) -> u64 {
        self.full * s as u64 + self.single + self.fixed
    }
    /// TCP sockets alone at `s` streams per bandwidth pair.
    pub fn sockets(&self, s: usize) -> u64 {
        self.full * s as u64 + self.single
    }
}

/// Every rank's `Need`, in O(world): counted in closed form from the layout rather than by asking
/// `pair_streams` about every pair (O(world²): 67 million pairs at 8,192 ranks, on every rank).
pub fn needs(lay: &HostLayout) -> Vec<Need> {
    let world = lay.host_of.len();
    // deeper[i]: hosts with more than i ranks, i.e. ranks of local index i, one per host.
    let mut deeper = vec![0u64; lay.hosts.iter().map(|h| h.len()).max().unwrap_or(0)];
    for h in lay.hosts.iter() {
        for d in deeper.iter_mut().take(h.len()) {
            *d += 1;
        }
    }
    (0..world)
        .map(|r| {
            let (h, me) = (lay.host_of[r], lay.local_of[r]);
            let here = lay.hosts[h].len() as u64;
            let remote = world as u64 - here;
            // counterparts: the rank of local index `me` on every other host that has one
            let mut full = deeper[me] - 1;
            // rank-order neighbours on another host that are not counterparts (counted already)
            let prev = (r + world - 1) % world;
            let next = (r + 1) % world;
            // (two ranks in all: one neighbour, both ways)
            let distinct = if prev == next { 1 } else { 2 };
            for n in [prev, next].into_iter().take(distinct) {
                if n != r && lay.host_of[n] != h && lay.local_of[n] != me {
                    full += 1;
                }
            }
            Need { full, single: remote - full, fixed: 1 + (here - 1) + 2 + MARGIN }
        })
        .collect()
}

/// The group's decision, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Streams per bandwidth pair for every rank.
    pub nstreams: usize,
    /// Where fewer than WIRESPEED_NSTREAMS: the rank whose hard limit decided it.
    pub tightest: Option<usize>,
    /// Every rank's descriptors at `nstreams`, what it holds included.
    pub totals: Vec<u64>,
}

/// The stream count every rank uses, from every rank's room (see the module's opening): the most
/// streams up to WIRESPEED_NSTREAMS that every rank's hard limit holds, or the error every rank
/// raises. `rooms[r]` is rank r's.
pub fn plan(lay: &HostLayout, rooms: &[FdRoom]) -> Result<Plan> {
    let world = lay.host_of.len();
    if rooms.len() != world {
        return Err(Error::Mismatch(format!("{} open-file rooms for a world of {world}", rooms.len())));
    }
    let n = rooms[0].nstreams;
    if let Some(r) = rooms.iter().position(|x| x.nstreams != n) {
        let say = |k: usize| match rooms[k].nstreams {
            0 => "invalid TCP knobs (it says which)".to_string(),
            v => format!("WIRESPEED_NSTREAMS={v}"),
        };
        return Err(Error::Mismatch(format!(
            "rank 0 has {} and rank {r} {}: give every rank the same WIRESPEED_* environment",
            say(0),
            say(r)
        )));
    }
    let needs = needs(lay);
    // The most streams each rank can hold; the group takes the least.
    let mut streams = n;
    let mut tightest = None;
    let mut short = Vec::new();
    for (r, (need, room)) in needs.iter().zip(rooms).enumerate() {
        // (saturating: the rooms come from the store, so a wild value must not wrap around)
        let base = room.held.saturating_add(need.at(0));
        // (a rank with no bandwidth pair needs the same at any count: all of them fit)
        let fits = if room.limit < base.saturating_add(need.full) {
            0
        } else {
            (room.limit - base).checked_div(need.full).map_or(n, |k| k.min(n as u64) as usize)
        };
        if fits == 0 {
            short.push(r);
        } else if fits < streams {
            streams = fits;
            tightest = Some(r);
        }
    }
    if let Some(&r) = short.first() {
        let (need, room) = (needs[r], rooms[r]);
        let (least, most) = (room.held.saturating_add(need.at(1)), room.held.saturating_add(need.at(n)));
        let others = match short.len() - 1 {
            0 => String::new(),
            1 => "; 1 other rank is short too".to_string(),
            k => format!("; {k} other ranks are short too"),
        };
        // One line of at most ~250 characters: the CLI prints the first 300 after its own prefix.
        return Err(Error::Unsupported(format!(
            "rank {r} needs {most} open files at WIRESPEED_NSTREAMS={n} and {least} at the fewest, WIRESPEED_NSTREAMS=1, \
             but its hard limit is {}: raise it where the ranks start (`ulimit -n {most}` as root, limits.conf or the \
             launcher's setting){others}",
            room.limit
        )));
    }
    let totals = needs.iter().zip(rooms).map(|(need, room)| room.held.saturating_add(need.at(streams))).collect();
    Ok(Plan { nstreams: streams, tightest, totals })
}

/// Carry out `plan` on this rank: raise its soft limit to its hard one if what it needs is above
/// it. On rank 0, say on stderr when the streams were reduced (every rank knows; one says it).
pub fn apply(plan: &Plan, rank: usize, rooms: &[FdRoom]) -> Result<()> {
    let (soft, _) = crate::sys::nofile_limits()?;
    if plan.totals[rank] > soft {
        crate::sys::set_nofile_soft(rooms[rank].limit)?;
    }
    if let (Some(t), 0) = (plan.tightest, rank) {
        let want = rooms[0].nstreams;
        eprintln!(
            "wirespeed: rank {t}'s hard open-file limit ({}) holds {} TCP streams per peer, not WIRESPEED_NSTREAMS={want}: using {} \
             (bandwidth on links that cap single flows may suffer; `ulimit -n` to raise it)",
            rooms[t].limit, plan.nstreams, plan.nstreams
        );
    }
    Ok(())
}

/// The line rank 0 says when `somaxconn` (net.core.somaxconn, which caps every listener's
/// backlog, transport/tcp/handshake.rs) is below the most TCP streams that may dial one rank of
/// this layout at once: every stream from the ranks below it on other hosts, at the first
/// collective that uses every pair (an all_to_all; at setup with WIRESPEED_CONNECT=eager). Dials
/// beyond the backlog are dropped and retried by the kernel after 1, 2, 4 s, so setup or that
/// first collective stalls in steps. None when the backlog holds them.
pub fn backlog_line(lay: &HostLayout, nstreams: usize, somaxconn: u64) -> Option<String> {
    let most = needs(lay).iter().map(|n| n.sockets(nstreams)).max().unwrap_or(0);
    (most > somaxconn).then(|| format!(
        "wirespeed: net.core.somaxconn is {somaxconn} on rank 0's host, and up to {most} TCP streams may dial one rank of \
         this group at once (a collective that uses every pair): dials beyond it wait 1-7 s; raise it on every host \
         (`sysctl -w net.core.somaxconn={}`)", most.next_power_of_two().min(65_535)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_below_what_the_layout_may_dial_is_named_once_with_its_sysctl() {
        let big = HostLayout::new(&(0..8192).map(|r| format!("h{}", r / 8)).collect::<Vec<_>>());
        let line = backlog_line(&big, 12, 4096).expect("1,024 x 8 at 12 streams exceeds 4,096");
        assert!(line.contains("net.core.somaxconn is 4096") && line.contains("19448"), "{line}");
        assert!(line.contains("sysctl -w net.core.somaxconn=32768"), "{line}");
        assert_eq!(backlog_line(&big, 12, 65_535), None);
        assert_eq!(backlog_line(&layout(&[0, 0, 1, 1]), 12, 128), None); // 24 + 1 streams
    }

    fn layout(hosts_of: &[usize]) -> HostLayout {
        HostLayout::new(&hosts_of.iter().map(|h| format!("h{h}")).collect::<Vec<_>>())
    }

    fn room(nstreams: usize, limit: u64, held: u64) -> FdRoom {
        FdRoom { nstreams, limit, held }
    }

    /// The closed form agrees with asking `pair_streams` about every pair, on layouts with
    /// uneven hosts, interleaved and blocked ranks, and two ranks in all.
    #[test]
    fn needs_count_what_pair_streams_opens() {
        let layouts: Vec<Vec<usize>> = vec![
            vec![0, 1],
            vec![0, 0, 1],
            vec![0, 1, 2, 0, 1, 2],
            vec![0, 0, 1, 1, 2, 2],
            vec![0, 0, 0, 1],
            vec![0, 1, 1, 1, 2, 0, 3],
            (0..64).map(|r| r % 8).collect(),
            (0..64).map(|r| r / 8).collect(),
            (0..50).map(|r| (r * 7 + r / 3) % 5).collect(),
        ];
        for ids in layouts {
            let lay = layout(&ids);
            let world = ids.len();
            for (r, need) in needs(&lay).iter().enumerate() {
                for s in [1, 3, 12] {
                    let by_pairs: usize = (0..world).map(|p| lay.pair_streams(r, p, s)).sum();
                    assert_eq!(need.sockets(s), by_pairs as u64, "layout {ids:?} rank {r} at {s} streams");
                }
                let here = lay.hosts[lay.host_of[r]].len() as u64;
                assert_eq!(need.fixed, 1 + (here - 1) + 2 + MARGIN);
            }
        }
    }

    /// The job: 3 hosts x 2 ranks round robin, 12 streams; rank 0 holds 20 (it serves the
    /// store), the others 5 (stdio, the store's socket), each plus 3 of the reactor's.
    #[test]
    fn three_hosts_of_two_fit_a_hard_limit_of_20000_and_not_60() {
        let lay = layout(&[0, 1, 2, 0, 1, 2]);
        let held = |r: usize| if r == 0 { 23 } else { 8 };
        // rank 0: counterparts 1, 2 and neighbour 5 at 12 streams, rank 4 at one: 37 sockets
        assert_eq!(needs(&lay)[0], Need { full: 3, single: 1, fixed: 4 + MARGIN });
        let rooms: Vec<FdRoom> = (0..6).map(|r| room(12, 20000, held(r))).collect();
        let p = plan(&lay, &rooms).unwrap();
        assert_eq!((p.nstreams, p.tightest), (12, None));
        assert_eq!(p.totals[0], 23 + 37 + 4 + MARGIN);
        // hard 60: 1 stream needs 23 + 4 + 4 + 64 = 95 on rank 0, 8 + 3 + 4 + 64 = 79 on the rest
        let rooms: Vec<FdRoom> = (0..6).map(|r| room(12, 60, held(r))).collect();
        let e = plan(&lay, &rooms).unwrap_err().to_string();
        assert_eq!(e, "rank 0 needs 128 open files at WIRESPEED_NSTREAMS=12 and 95 at the fewest, WIRESPEED_NSTREAMS=1, but its hard limit is 60: raise it where the ranks start (`ulimit -n 128` as root, limits.conf or the launcher's setting); 5 other ranks are short too");
        // the longest it gets still fits the 300 characters the CLI prints
        let big = layout(&(0..8192).map(|r| r % 1024).collect::<Vec<_>>());
        let rooms: Vec<FdRoom> = (0..8192).map(|_| room(64, 1024, 100_000)).collect();
        let e = plan(&big, &rooms).unwrap_err().to_string();
        assert!(e.len() < 280 && e.ends_with("; 8191 other ranks are short too"), "{} {e}", e.len());
    }

    /// Between the two limits, the tightest rank decides how many streams everyone uses; a rank
    /// with no bandwidth pair (every neighbour on its host, no counterpart) needs the same at any
    /// count.
    #[test]
    fn the_tightest_rank_sets_every_ranks_stream_count() {
        let lay = layout(&[0, 1, 2, 0, 1, 2]);
        // rank 4 (full 2, single 2): 10 + 2s + 2 + 4 + 64 <= 100  =>  s <= 10
        let mut rooms: Vec<FdRoom> = (0..6).map(|_| room(12, 20000, 10)).collect();
        rooms[4].limit = 100;
        let p = plan(&lay, &rooms).unwrap();
        assert_eq!((p.nstreams, p.tightest), (10, Some(4)));
        assert!(p.totals[4] <= 100 && p.totals.iter().zip(&rooms).all(|(t, r)| t <= &r.limit));
        // one less and it holds 9
        rooms[4].limit = 99;
        assert_eq!(plan(&lay, &rooms).unwrap().nstreams, 9);
        // ranks 0, 1, 2 on host 0, rank 3 alone: rank 1's neighbours are on its host and host 1
        // has no rank of local index 1, so its need does not depend on the stream count
        let lay = layout(&[0, 0, 0, 1]);
        let n = needs(&lay);
        assert_eq!((n[1].full, n[1].single), (0, 1));
        let mut rooms: Vec<FdRoom> = (0..4).map(|_| room(12, 20000, 10)).collect();
        rooms[1].limit = 10 + n[1].at(0);
        assert_eq!(plan(&lay, &rooms).unwrap().nstreams, 12);
        rooms[1].limit -= 1;
        assert!(plan(&lay, &rooms).unwrap_err().to_string().starts_with("rank 1 needs"));
    }

    #[test]
    fn ranks_that_disagree_on_the_stream_count_fail_alike() {
        let lay = layout(&[0, 1]);
        let e = plan(&lay, &[room(12, 1000, 5), room(4, 1000, 5)]).unwrap_err();
        assert_eq!(e, Error::Mismatch("rank 0 has WIRESPEED_NSTREAMS=12 and rank 1 WIRESPEED_NSTREAMS=4: give every rank the same WIRESPEED_* environment".into()));
        let e = plan(&lay, &[room(12, 1000, 5), room(0, 1000, 5)]).unwrap_err().to_string();
        assert!(e.contains("rank 1 invalid TCP knobs"), "{e}");
    }

    #[test]
    fn rooms_travel_as_text() {
        let r = room(12, 1048576, 23);
        assert_eq!(FdRoom::parse(&r.to_text(), 3).unwrap(), r);
        for bad in ["", "12:5", "12:5:x", "1:2:3:4", "a host id"] {
            assert!(FdRoom::parse(bad, 3).unwrap_err().to_string().starts_with("rank 3 published"), "{bad}");
        }
        let here = FdRoom::here(&Ok(NetConfig::default())).unwrap();
        assert_eq!(here.nstreams, NetConfig::default().nstreams);
        assert!(here.held >= 3 + 3 && here.limit >= 3, "{here:?}");
    }
}
