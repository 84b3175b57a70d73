//! Ranks on different "hosts" as threads of one process: host ids are given explicitly, so ranks
//! with different ids talk real TCP over loopback (several streams, handshake, framing) and ranks
//! with equal ids real shared memory. Multi-process and namespace runs are in tests/native.
mod common;

use common::{config, input, setups, with_groups, with_hosts, with_hosts_rooms};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use wirespeed_core::RankInfo;
use wirespeed_core::testing::fds::{self, FdRoom};
use wirespeed_core::testing::HostLayout;
use wirespeed_core::testing::NetAlgo;
use wirespeed_core::{Collectives, DType, Engine, Error, Op, ReduceOp};

const LAYOUTS: &[&[&str]] = &[&["a", "b"], &["a", "b", "a", "b"], &["a", "a", "b"], &["a", "b", "c"]];

#[test]
fn all_reduce_across_hosts_is_exact_for_every_layout_size_and_op() {
    for ids in LAYOUTS {
        let w = ids.len();
        // Auto (small sizes take recursive doubling among leaders on 2 hosts, the ring otherwise),
        // the hierarchy forced onto the ring among leaders, the flat ring over every rank (shm
        // and TCP hops mixed) and doubling forced at every size (3 hosts fall back to the ring);
        // 700_001 elements span several pipelined ring slices, the last one short.
        let out = with_hosts(ids, move |c| {
            let mut res = Vec::new();
            for algo in [None, Some(NetAlgo::Hier), Some(NetAlgo::Ring), Some(NetAlgo::Doubling)] {
                c.force_all_reduce(algo);
                for &n in &[0usize, 1, 17, 1000, 700_001] {
                    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                        let mut v = input(c.rank, n);
                        // SAFETY: `v` holds `n` i64s and outlives the call; nothing else touches
                        // it.
                        unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::I64, op) }.unwrap_or_else(|e| panic!("rank {} n {n} op {op:?} {algo:?} hosts {:?}: {e:?}", c.rank, c.hosts()));
                        res.push((n, op, v));
                    }
                }
            }
            res
        });
        let inputs: Vec<Vec<i64>> = (0..w).map(|r| input(r, 700_001)).collect();
        for (r, res) in out.iter().enumerate() {
            for (n, op, got) in res {
                let want: Vec<i64> = (0..*n)
                    .map(|i| match op {
                        ReduceOp::Sum => inputs.iter().map(|v| v[i]).sum(),
                        ReduceOp::Max => inputs.iter().map(|v| v[i]).max().unwrap(),
                        _ => inputs.iter().map(|v| v[i]).sum::<i64>() / w as i64,
                    })
                    .collect();
                assert!(got == &want, "layout {ids:?} rank {r} n {n} op {op:?}");
            }
        }
    }
}

/// A byte from every rank to every other, point to point: every remote pair is connected after
/// it (connections are made on first use), whatever path the collectives take.
fn touch_every_pair(c: &mut wirespeed_core::testing::hosts::Group) {
    // 1 MiB: past the size that opens all of a pair's streams (a pair starts with one, mesh.rs).
    const LEN: usize = 1 << 20;
    let (me, w) = (c.rank, c.world);
    let out: Vec<u8> = (0..LEN).map(|i| (me * 7 + i) as u8).collect();
    let mut inb = vec![0u8; LEN];
    // SAFETY: `out` outlives every ticket, all waited below, and is not written.
    let ts: Vec<_> = (0..w).filter(|&j| j != me).map(|j| unsafe { c.send_post(j, out.as_ptr() as usize, LEN, 77) }.unwrap()).collect();
    for j in (0..w).filter(|&j| j != me) {
        // SAFETY: `inb`, alive and written only by this call.
        unsafe { c.recv(j, inb.as_mut_ptr() as usize, LEN, 77) }.unwrap();
        assert!(inb.iter().enumerate().all(|(i, &b)| b == (j * 7 + i) as u8), "from {j}");
    }
    ts.into_iter().for_each(|t| t.wait().unwrap());
}

/// Rank `c`'s streams to each rank once they stop changing toward `want` (a grown pair's last
/// streams attach on the engine's thread, possibly after the message that asked for them).
fn streams_settled(c: &wirespeed_core::testing::hosts::Group, want: impl Fn(usize) -> usize) -> Vec<usize> {
    let t = std::time::Instant::now();
    loop {
        let got: Vec<usize> = (0..c.world).map(|r| c.streams_to(r)).collect();
        if got.iter().enumerate().all(|(r, &n)| n == want(r)) || t.elapsed() > Duration::from_secs(10) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// all_to_all across hosts with small pieces goes through the host leaders: exact on uneven and
/// cyclic layouts of 3 and 4 hosts with pieces of different lengths per pair (zeros among
/// them), and after it a non-leader holds TCP with no rank (setup's probe and broadcast use
/// leaders only) and a leader with leaders only. A large all_to_all (pieces above
/// `WIRESPEED_A2A_LEADERS_MAX`) stays direct: a non-leader then talks to every remote rank.
#[test]
fn small_all_to_all_across_hosts_goes_through_the_leaders() {
    let layouts: &[&[&str]] = &[&["a", "a", "b", "b", "c", "c"], &["a", "b", "c", "a", "b", "c", "c"], &["a", "a", "a", "b", "c", "c", "d", "d"]];
    for &ids in layouts {
        let w = ids.len();
        let len = |from: usize, to: usize| (from * 5 + to * 3) % 7 * 4;
        let body = move |from: usize, to: usize| -> Vec<u8> { (0..len(from, to)).map(|i| (from * 40 + to + i) as u8).collect() };
        let out = with_hosts(ids, move |c| {
            let me = c.rank;
            let leaders: Vec<usize> = c.hosts().iter().map(|h| h[0]).collect();
            let sends: Vec<Vec<u8>> = (0..w).map(|j| body(me, j)).collect();
            let mut recvs: Vec<Vec<u8>> = (0..w).map(|j| vec![0xEE; len(j, me)]).collect();
            let s: Vec<_> = sends.iter().map(|v| (v.as_ptr() as usize, v.len())).collect();
            let r: Vec<_> = recvs.iter_mut().map(|v| (v.as_mut_ptr() as usize, v.len())).collect();
            // SAFETY: every range is its own Vec, alive and untouched by anything else during
            // the call.
            unsafe { c.all_to_all(&s, &r) }.unwrap();
            let after_small = c.connected();
            let big = 20 << 10;
            let (sb, mut rb) = (vec![me as u8; big * w], vec![0u8; big * w]);
            let s: Vec<_> = (0..w).map(|j| (sb.as_ptr() as usize + j * big, big)).collect();
            let r: Vec<_> = (0..w).map(|j| (rb.as_mut_ptr() as usize + j * big, big)).collect();
            // SAFETY: `sb` and `rb` outlive the call; `s` and `r` cut them into disjoint runs.
            unsafe { c.all_to_all(&s, &r) }.unwrap();
            assert!((0..w).all(|j| rb[j * big..(j + 1) * big].iter().all(|&x| x == j as u8)), "{ids:?}: large all_to_all on {me}");
            (leaders.contains(&me), leaders, recvs, after_small, c.connected())
        });
        for (me, (leader, leaders, recvs, small, big)) in out.into_iter().enumerate() {
            for (j, got) in recvs.iter().enumerate() {
                assert_eq!(*got, body(j, me), "{ids:?}: rank {me}'s piece from {j}");
            }
            let remote: Vec<usize> = (0..w).filter(|&j| ids[j] != ids[me]).collect();
            if leader {
                assert!(small.iter().all(|r| leaders.contains(r)), "{ids:?}: leader {me} connected to {small:?}");
            } else {
                assert!(small.is_empty(), "{ids:?}: non-leader {me} connected to {small:?} after a small all_to_all");
                assert_eq!(big, remote, "{ids:?}: non-leader {me} after a large all_to_all");
            }
        }
    }
}

#[test]
fn every_other_collective_and_p2p_across_hosts() {
    // The last layout has pairs that are neither counterparts nor neighbours (one stream).
    let six: &[&str] = &["a", "a", "b", "b", "c", "c"];
    for ids in LAYOUTS.iter().copied().chain([six]) {
        let w = ids.len();
        let out = with_hosts(ids, move |c| {
            let me = c.rank;
            let n = 3001usize;
            let mine: Vec<i32> = (0..n).map(|i| (me * 10_000 + i) as i32).collect();
            let mut all = vec![0i32; n * w];
            let recv: Vec<(usize, usize)> = (0..w).map(|j| (all.as_mut_ptr() as usize + j * n * 4, n * 4)).collect();
            // SAFETY: `mine` (n i32s) and `all` outlive the call; `recv` cuts `all` into disjoint
            // runs of n i32s, one per rank.
            unsafe { c.all_gather((mine.as_ptr() as usize, n * 4), &recv) }.unwrap();
            let send: Vec<i32> = (0..w * 3).map(|k| (me * 100 + k / 3) as i32).collect();
            let mut a2a = vec![0i32; w * 3];
            let s: Vec<_> = (0..w).map(|j| (send.as_ptr() as usize + j * 12, 12)).collect();
            let r: Vec<_> = (0..w).map(|j| (a2a.as_mut_ptr() as usize + j * 12, 12)).collect();
            // SAFETY: `send` and `a2a` outlive the call; `s` and `r` cut them into disjoint 12-byte
            // runs, one per rank.
            unsafe { c.all_to_all(&s, &r) }.unwrap();
            if w == 6 {
                touch_every_pair(c);
                // Every remote pair is connected now (on first use, the default): counterparts (same local index) and rank-order neighbours
                // with every stream; 0-3, 1-4 and 2-5 are neither and have one; ranks of one
                // host none.
                let full = config().net.unwrap().nstreams;
                let want = |r: usize| if r / 2 == me / 2 { 0 } else if (r + 3) % 6 == me { 1 } else { full };
                for (r, got) in streams_settled(c, want).into_iter().enumerate() {
                    assert_eq!(got, want(r), "streams between {me} and {r}");
                }
            }
            let mut bcast = Vec::new();
            for root in 0..w {
                let mut b = vec![me as u8; 5000];
                // SAFETY: `b` holds 5000 bytes and outlives the call.
                unsafe { c.broadcast((b.as_mut_ptr() as usize, 5000), root) }.unwrap();
                bcast.push(b);
            }
            let mut red = input(me, 5000);
            // SAFETY: `red` holds 5000 i64s and outlives the call.
            unsafe { c.reduce(red.as_mut_ptr() as usize, 5000, DType::I64, ReduceOp::Sum, w - 1) }.unwrap();
            let rs_in: Vec<i64> = input(me, 700 * w);
            let mut rs_out = vec![0i64; 700];
            let rs: Vec<_> = (0..w).map(|j| (rs_in.as_ptr() as usize + j * 700 * 8, 700 * 8)).collect();
            // SAFETY: `rs_in` and `rs_out` (700 i64s) outlive the call; `rs` cuts `rs_in` into
            // disjoint runs of 700 i64s, one per rank.
            unsafe { c.reduce_scatter(&rs, rs_out.as_mut_ptr() as usize, 700, DType::I64, ReduceOp::Sum) }.unwrap();
            let mut gathered = vec![0i32; n * w];
            let gr: Vec<_> = (0..w).map(|j| (gathered.as_mut_ptr() as usize + j * n * 4, n * 4)).collect();
            // SAFETY: `mine` and `gathered` outlive the call; `gr` cuts `gathered` into disjoint
            // runs (used on the root only).
            unsafe { c.gather((mine.as_ptr() as usize, n * 4), if me == 0 { &gr } else { &[] }, 0) }.unwrap();
            let mut sc = vec![0i32; n];
            // SAFETY: `sc` holds n i32s and outlives the call; on the root (rank 1) `recv` cuts
            // `all`, alive and unwritten during the call, into its runs.
            unsafe { c.scatter(if me == 1 { &recv } else { &[] }, (sc.as_mut_ptr() as usize, n * 4), 1) }.unwrap();
            c.barrier().unwrap();
            let msg = vec![me as u64 + 7; 333_333];
            let mut inbox = vec![0u64; 333_333];
            // SAFETY: `msg` outlives the ticket, waited below, and is not written.
            let t = unsafe { c.send_post((me + 1) % w, msg.as_ptr() as usize, msg.len() * 8, 5) }.unwrap();
            // SAFETY: `inbox` holds inbox.len() u64s, written only by this call.
            unsafe { c.recv((me + w - 1) % w, inbox.as_mut_ptr() as usize, inbox.len() * 8, 5) }.unwrap();
            t.wait().unwrap();
            (all, a2a, bcast, red, rs_out, gathered, sc, inbox)
        });
        for (me, (all, a2a, bcast, red, rs_out, gathered, sc, inbox)) in out.into_iter().enumerate() {
            let want_all: Vec<i32> = (0..w).flat_map(|j| (0..3001).map(move |i| (j * 10_000 + i) as i32)).collect();
            assert_eq!(all, want_all, "{ids:?} all_gather on {me}");
            assert_eq!(a2a, (0..w * 3).map(|k| (k / 3 * 100 + me) as i32).collect::<Vec<_>>(), "{ids:?} all_to_all");
            for (root, b) in bcast.iter().enumerate() {
                assert!(b.iter().all(|&x| x as usize == root), "{ids:?} broadcast from {root} on {me}");
            }
            if me == w - 1 {
                let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r, 5000)).collect();
                let want: Vec<i64> = (0..5000).map(|i| ins.iter().map(|v| v[i]).sum()).collect();
                assert_eq!(red, want, "{ids:?} reduce");
            } else {
                assert_eq!(red, input(me, 5000), "{ids:?} reduce leaves non-roots alone");
            }
            let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r, 700 * w)).collect();
            let want_rs: Vec<i64> = (0..700).map(|i| ins.iter().map(|v| v[me * 700 + i]).sum()).collect();
            assert_eq!(rs_out, want_rs, "{ids:?} reduce_scatter on {me}");
            if me == 0 {
                assert_eq!(gathered, want_all, "{ids:?} gather");
            }
            assert_eq!(sc, want_all[me * 3001..(me + 1) * 3001].to_vec(), "{ids:?} scatter to {me}");
            assert!(inbox.iter().all(|&x| x == ((me + w - 1) % w) as u64 + 7), "{ids:?} p2p on {me}");
        }
    }
}

/// One rank's hard open-file limit holds 5 streams per bandwidth pair: every rank connects every
/// such pair with 5 (the pairs of one stream keep one), and collectives over them are exact.
#[test]
fn the_tightest_ranks_open_file_limit_sets_every_pairs_streams() {
    let six: &[&str] = &["a", "a", "b", "b", "c", "c"];
    let lay = HostLayout::new(&six.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let held = 10;
    // Rank 3 gets exactly its need at 5 streams; the limits stay far below this process's soft
    // limit, so no rank raises it (the test process's limit is not ours to change).
    let mut rooms: Vec<FdRoom> = (0..6).map(|_| FdRoom { nstreams: 12, limit: 20000, held }).collect();
    rooms[3].limit = held + fds::needs(&lay)[3].at(5);
    assert_eq!(fds::plan(&lay, &rooms).unwrap().nstreams, 5);
    let out = with_hosts_rooms(six, &rooms, |c| {
        let me = c.rank;
        // Every pair first, so every remote pair is connected (on first use, the default)
        // before the streams are counted.
        touch_every_pair(c);
        let streams = streams_settled(c, |r| if r / 2 == me / 2 { 0 } else if (r + 3) % 6 == me { 1 } else { 5 });
        let n = 300_001usize;
        let mut v: Vec<i64> = input(me, n);
        // SAFETY: `v` holds n i64s and outlives the call.
        unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::I64, ReduceOp::Sum) }.unwrap();
        (me, streams, v)
    });
    let n = 300_001usize;
    let inputs: Vec<Vec<i64>> = (0..6).map(|r| input(r, n)).collect();
    let want: Vec<i64> = (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
    for (me, streams, got) in out {
        for (r, &s) in streams.iter().enumerate() {
            let expect = if r / 2 == me / 2 { 0 } else if (r + 3) % 6 == me { 1 } else { 5 };
            assert_eq!(s, expect, "streams between {me} and {r}");
        }
        assert!(got == want, "rank {me}'s all_reduce");
    }
}

#[test]
fn strangers_and_other_jobs_are_refused_and_the_job_goes_on() {
    use std::io::Write;
    let s = setups(&["a", "b"], Duration::from_secs(20));
    let other = setups(&["a", "b"], Duration::from_secs(20)); // another job: another token
    let infos: Vec<RankInfo> = s.iter().map(|x| x.info()).collect();
    let target = infos[1].addr.clone();
    // Garbage, a silent connection, and a real hello of another job, before the peers connect.
    let mut g = std::net::TcpStream::connect(&target).unwrap();
    g.write_all(&[0xffu8; 4096]).unwrap();
    let _silent = std::net::TcpStream::connect(&target).unwrap();
    let other_infos: Vec<RankInfo> = other.iter().map(|x| x.info()).collect();
    let mut other_infos = other_infos;
    other_infos[1].addr = target.clone(); // rank 0 of the other job dials our rank 1
    let mut it = other.into_iter();
    let o0 = it.next().unwrap();
    // Connections are made on first use: the intruder dials when it sends.
    let intruder = std::thread::spawn(move || {
        o0.connect(&other_infos)
            .and_then(|mut c| {
                let b = [1u8; 8];
                // SAFETY: `b` outlives the ticket, waited at once.
                unsafe { c.send_post(1, b.as_ptr() as usize, 8, 3) }?.wait()
            })
            .err()
    });
    let (tx, rx) = mpsc::channel();
    let hs: Vec<_> = s
        .into_iter()
        .enumerate()
        .map(|(r, x)| {
            let (infos, tx) = (infos.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut c = x.connect(&infos).unwrap();
                let mut v = input(r, 100_000);
                // SAFETY: `v` holds v.len() i64s and outlives the call.
                unsafe { c.all_reduce(v.as_mut_ptr() as usize, v.len(), DType::I64, ReduceOp::Sum) }.unwrap();
                // A stranger during the job is refused too.
                if r == 1 {
                    let mut late = std::net::TcpStream::connect(&infos[1].addr).unwrap();
                    let _ = late.write_all(b"GET / HTTP/1.0\r\n\r\n");
                    // Closed before the pause: its short hello ends there and is refused within
                    // it, before this rank counts refusals (a fast all_reduce left no time).
                    drop(late);
                    std::thread::sleep(Duration::from_millis(300));
                }
                // SAFETY: as for the first all_reduce.
                unsafe { c.all_reduce(v.as_mut_ptr() as usize, v.len(), DType::I64, ReduceOp::Sum) }.unwrap();
                tx.send((r, v, c.refused())).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let err = intruder.join().unwrap().expect("the other job's rank must not connect");
    assert!(matches!(err, Error::Stranger(_) | Error::PeerAborted { .. } | Error::PeerLost(_) | Error::Timeout { .. }), "{err:?}");
    let (a, b) = (input(0, 100_000), input(1, 100_000));
    let want: Vec<i64> = (0..100_000).map(|i| 2 * (a[i] + b[i])).collect();
    let mut refused = 0;
    for (_, v, n) in rx.try_iter() {
        assert_eq!(v, want);
        refused += n;
    }
    assert!(refused >= 3, "garbage, the other job and the late stranger are refused: {refused}");
}

#[test]
fn truncation_is_a_mismatch_and_a_dead_peer_fails_the_others_fast() {
    let out = with_hosts(&["a", "b", "c"], |c| {
        let me = c.rank;
        let buf = vec![1u8; 1000];
        let mut inbox = vec![0u8; 500];
        let first = match me {
            // SAFETY: `buf` outlives the send: it drops when this closure ends, after the
            // all_reduce below, which fails (rank 1 broke the group on the mismatch) and so shuts
            // every connection before it returns (hosts::Group::guarded).
            0 => unsafe { c.send_post(1, buf.as_ptr() as usize, 1000, 0) }.and_then(|t| t.wait()),
            // SAFETY: `inbox` holds 500 bytes, written only by this call (the 1000-byte message
            // is refused on its header).
            1 => unsafe { c.recv(0, inbox.as_mut_ptr() as usize, 500, 0) },
            _ => Ok(()),
        };
        // Rank 1 broke the group on the mismatch: rank 0 and rank 2 learn within the timeout.
        let t = Instant::now();
        let mut v = vec![1i64; 10_000];
        // SAFETY: `v` holds 10_000 i64s and outlives the call.
        let second = unsafe { c.all_reduce(v.as_mut_ptr() as usize, v.len(), DType::I64, ReduceOp::Sum) };
        (first, second, t.elapsed())
    });
    assert!(matches!(&out[1].0, Err(Error::Mismatch(m)) if m.contains("1000") && m.contains("500")), "{:?}", out[1].0);
    for (r, (_, second, took)) in out.iter().enumerate() {
        assert!(second.is_err(), "rank {r} must fail after the group broke");
        assert!(*took < Duration::from_secs(10), "rank {r} took {took:?}");
    }
    assert!(matches!(out[0].1, Err(Error::PeerAborted { .. }) | Err(Error::Broken(_))), "{:?}", out[0].1);
}

/// A send whose receiver does not come within the timeout fails and breaks the group, over
/// shared memory (one host) and over TCP (two hosts; the message far more than the sockets
/// buffer while nobody reads, so it cannot complete alone): the receiver, coming later, fails
/// instead of taking the bytes (over shared memory it is told the sender aborted; over TCP its
/// connection is shut), and the sender's next op reports the broken group at once.
#[test]
fn a_timed_out_send_breaks_the_group_on_one_host_and_across_hosts() {
    for (ids, n) in [(["a", "a"], 1 << 16), (["a", "b"], 64 << 20)] {
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let out = with_groups(&ids, Duration::from_secs(1), move |mut c, _| {
            if c.rank() == 0 {
                let e = Engine::with(c, true).unwrap();
                let msg = vec![7u8; n];
                let addr = msg.as_ptr() as usize;
                // SAFETY: the owner holds `msg`, whose heap memory is the op's buffer.
                let sent = unsafe { e.run(Op::Send { to: 1, buf: (addr, n), tag: 3 }, Box::new(msg)) };
                both.wait();
                both.wait();
                // SAFETY: no buffers.
                let next = unsafe { e.run(Op::Barrier, Box::new(())) };
                (sent.map(|_| ()), next.map(|_| ()))
            } else {
                both.wait();
                let mut got = vec![0u8; n];
                // SAFETY: `got` lives, untouched by anyone else, through the call.
                let r = unsafe { c.recv(0, got.as_mut_ptr() as usize, n, 3) };
                both.wait();
                (r, Ok(()))
            }
        });
        assert!(matches!(out[0].0, Err(Error::Timeout { .. })), "{ids:?}: {:?}", out[0].0);
        assert!(out[1].0.is_err(), "{ids:?}: rank 1 took the bytes of a send that failed");
        if ids[0] == ids[1] {
            assert!(matches!(out[1].0, Err(Error::PeerAborted { rank: 0, .. })), "{ids:?}: {:?}", out[1].0);
        }
        assert!(matches!(out[0].1, Err(Error::Broken(_))), "{ids:?}: {:?}", out[0].1);
    }
}

/// A peer's failure on the same host names that peer's rank in the job, not its index among
/// the host's ranks: on hosts a, b, b, rank 2's one local peer is rank 1, index 0 on host b
/// (a killed rank was once reported as "peer rank 1" when rank 3 died, on 2 hosts x 2 ranks).
#[test]
fn a_local_peers_failure_names_its_rank_in_the_job() {
    let both = std::sync::Arc::new(std::sync::Barrier::new(2));
    let out = with_hosts(&["a", "b", "b"], move |c| match c.rank {
        1 => {
            c.abort(&Error::Broken("given up on purpose".into()));
            both.wait();
            Ok(())
        }
        2 => {
            both.wait();
            let mut got = [0u8; 8];
            // SAFETY: `got` lives, untouched by anyone else, through the call.
            unsafe { c.recv(1, got.as_mut_ptr() as usize, got.len(), 5) }
        }
        _ => Ok(()),
    });
    assert!(matches!(&out[2], Err(Error::PeerAborted { rank: 1, reason }) if reason.contains("on purpose")), "{:?}", out[2]);
    assert!(out[2].as_ref().unwrap_err().to_string().starts_with("peer rank 1 failed"), "{:?}", out[2]);
}

/// all_gather and reduce_scatter across 3 hosts or more take the ring from
/// `plan::GATHER_RING_MIN` bytes per chunk: layouts of one and two ranks per host, an odd and an
/// even number of hosts (so the ring's closing hop is and is not a counterpart pair), uneven
/// hosts; chunks of several pipeline pieces; out of place and in place.
#[test]
fn ring_all_gather_and_reduce_scatter_across_hosts() {
    let layouts: &[&[&str]] = &[&["a", "b", "c"], &["a", "b", "c", "d"], &["a", "b", "c", "a", "b", "c"], &["a", "a", "b", "b", "c"]];
    for ids in layouts.iter().copied() {
        let w = ids.len();
        let out = with_hosts(ids, move |c| {
            let me = c.rank;
            let mut res = Vec::new();
            for &n in &[(wirespeed_core::testing::GATHER_RING_MIN / 8), 300_001] {
                for in_place in [false, true] {
                    let mine = input(me, n);
                    let mut all = vec![0i64; n * w];
                    let recv: Vec<(usize, usize)> = (0..w).map(|j| (all.as_mut_ptr() as usize + j * n * 8, n * 8)).collect();
                    let send = if in_place {
                        all[me * n..(me + 1) * n].copy_from_slice(&mine);
                        recv[me]
                    } else {
                        (mine.as_ptr() as usize, n * 8)
                    };
                    // SAFETY: `mine` and `all` outlive the call; `recv` cuts `all` into disjoint
                    // runs of n i64s, one per rank, the own run being `send` in place.
                    unsafe { c.all_gather(send, &recv) }.unwrap_or_else(|e| panic!("{ids:?} rank {me} all_gather n {n}: {e}"));
                    let mut rs_in = input(me + 1, n * w);
                    let mut rs_out = vec![0i64; n];
                    let rs: Vec<_> = (0..w).map(|j| (rs_in.as_mut_ptr() as usize + j * n * 8, n * 8)).collect();
                    let out = if in_place { rs[me].0 } else { rs_out.as_mut_ptr() as usize };
                    for op in [ReduceOp::Sum, ReduceOp::Avg] {
                        let keep = rs_in.clone();
                        // SAFETY: `rs_in` and `rs_out` outlive the call; `rs` cuts `rs_in` into
                        // disjoint runs of n i64s; `out` is `rs_out` or, in place, our own run.
                        unsafe { c.reduce_scatter(&rs, out, n, DType::I64, op) }.unwrap_or_else(|e| panic!("{ids:?} rank {me} reduce_scatter n {n}: {e}"));
                        let got = if in_place { rs_in[me * n..(me + 1) * n].to_vec() } else { rs_out.clone() };
                        res.push((n, op, all.clone(), got));
                        rs_in.copy_from_slice(&keep);
                    }
                }
            }
            res
        });
        for (me, res) in out.into_iter().enumerate() {
            for (n, op, all, got) in res {
                let want_all: Vec<i64> = (0..w).flat_map(|j| input(j, n)).collect();
                assert!(all == want_all, "{ids:?} all_gather n {n} on {me}");
                let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r + 1, n * w)).collect();
                let sum = |i: usize| ins.iter().map(|v| v[me * n + i]).sum::<i64>();
                let want: Vec<i64> = (0..n).map(|i| if op == ReduceOp::Avg { sum(i) / w as i64 } else { sum(i) }).collect();
                assert!(got == want, "{ids:?} reduce_scatter {op:?} n {n} on {me}");
            }
        }
    }
}

/// Setup reports what it chose, alike on every rank: the TCP streams per peer across hosts
/// (a probe between the two hosts, over loopback), and nothing on one host.
#[test]
fn setup_reports_the_streams_chosen_across_hosts() {
    let across = with_groups(&["a", "b"], Duration::from_secs(10), |_, r| r.streams.map(|s| (s.opened, s.used, s.forced)));
    assert!(across.iter().all(|s| s.is_some() && *s == across[0]), "{across:?}");
    let one = with_groups(&["a", "a"], Duration::from_secs(10), |_, r| r.streams.is_none());
    assert_eq!(one, vec![true, true]);
}

/// Small all_gather and reduce_scatter (and barrier and reduce) across 3 and 4 hosts of 2-3
/// ranks, in blocks and dealt round robin: exact results, and they go through the host leaders,
/// so a rank that leads no host holds no TCP connection afterwards (connections are made on
/// first use) and a leader holds them with other leaders only.
#[test]
fn small_gathers_cross_hosts_through_the_leaders_only() {
    let layouts: &[&[&str]] = &[&["a", "a", "b", "b", "c", "c"], &["a", "b", "c", "a", "b", "c", "a"], &["a", "a", "a", "b", "c", "c", "d", "d"]];
    for ids in layouts.iter().copied() {
        let w = ids.len();
        let lay = HostLayout::new(&ids.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let leaders: Vec<usize> = lay.hosts.iter().map(|h| h[0]).collect();
        let out = with_hosts(ids, move |c| {
            let me = c.rank;
            let n = 1000usize;
            let mine = input(me, n);
            let mut all = vec![0i64; n * w];
            let recv: Vec<(usize, usize)> = (0..w).map(|j| (all.as_mut_ptr() as usize + j * n * 8, n * 8)).collect();
            // SAFETY: `mine` and `all` outlive the call; `recv` cuts `all` into disjoint runs.
            unsafe { c.all_gather((mine.as_ptr() as usize, n * 8), &recv) }.unwrap_or_else(|e| panic!("{ids:?} rank {me} all_gather: {e}"));
            let rs_in = input(me + 3, n * w);
            let mut rs_out = vec![0i64; n];
            let rs: Vec<_> = (0..w).map(|j| (rs_in.as_ptr() as usize + j * n * 8, n * 8)).collect();
            let mut got = Vec::new();
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                // SAFETY: `rs_in` and `rs_out` outlive the call; `rs` cuts `rs_in` into runs.
                unsafe { c.reduce_scatter(&rs, rs_out.as_mut_ptr() as usize, n, DType::I64, op) }.unwrap_or_else(|e| panic!("{ids:?} rank {me} reduce_scatter: {e}"));
                got.push(rs_out.clone());
            }
            c.barrier().unwrap();
            let mut red = input(me, n);
            // SAFETY: `red` holds n i64s and outlives the call.
            unsafe { c.reduce(red.as_mut_ptr() as usize, n, DType::I64, ReduceOp::Sum, w - 2) }.unwrap();
            (all, got, red, c.connected())
        });
        let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r + 3, 1000 * w)).collect();
        for (me, (all, got, red, connected)) in out.into_iter().enumerate() {
            let want_all: Vec<i64> = (0..w).flat_map(|j| input(j, 1000)).collect();
            assert!(all == want_all, "{ids:?} all_gather on {me}");
            for (op, g) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg].into_iter().zip(got) {
                let want: Vec<i64> = (0..1000)
                    .map(|i| {
                        let col = ins.iter().map(|v| v[me * 1000 + i]);
                        match op {
                            ReduceOp::Max => col.max().unwrap(),
                            ReduceOp::Sum => col.sum(),
                            _ => col.sum::<i64>() / w as i64,
                        }
                    })
                    .collect();
                assert!(g == want, "{ids:?} reduce_scatter {op:?} on {me}");
            }
            if me == w - 2 {
                let want: Vec<i64> = (0..1000).map(|i| (0..w).map(|r| input(r, 1000)[i]).sum()).collect();
                assert_eq!(red, want, "{ids:?} reduce");
            } else {
                assert_eq!(red, input(me, 1000), "{ids:?} reduce leaves non-roots alone");
            }
            if leaders.contains(&me) {
                assert!(connected.iter().all(|r| leaders.contains(r)), "{ids:?}: leader {me} connected to {connected:?}");
            } else {
                assert_eq!(connected, Vec::<usize>::new(), "{ids:?}: rank {me} leads no host, yet holds TCP connections");
            }
        }
    }
}

/// gather and scatter across 3 and 4 hosts, in blocks and dealt round robin, from every root:
/// exact results with pieces of different lengths (zeros among them), and they go through the
/// host leaders (algo/leaders_gs.rs), so a rank that leads no host holds no TCP connection
/// afterwards, the roots included, and a leader holds them with other leaders only (a direct
/// gather connects the root to every remote rank).
#[test]
fn gather_and_scatter_cross_hosts_through_the_leaders_only() {
    let layouts: &[&[&str]] = &[&["a", "a", "b", "b", "c", "c"], &["a", "b", "c", "a", "b", "c", "a"], &["a", "a", "a", "b", "c", "c", "d", "d"]];
    for ids in layouts.iter().copied() {
        let w = ids.len();
        let len = |r: usize, root: usize| (r * 5 + root * 3) % 7 * 100;
        let body = move |from: usize, to: usize, n: usize| -> Vec<u8> { (0..n).map(|i| (from * 40 + to * 7 + i) as u8).collect() };
        let lay = HostLayout::new(&ids.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let leaders: Vec<usize> = lay.hosts.iter().map(|h| h[0]).collect();
        let out = with_hosts(ids, move |c| {
            let me = c.rank;
            let mut per_root = Vec::new();
            for root in 0..w {
                let mine = body(me, root, len(me, root));
                let mut got: Vec<Vec<u8>> = (0..w).map(|j| vec![0xEE; len(j, root)]).collect();
                let r: Vec<_> = got.iter_mut().map(|v| (v.as_mut_ptr() as usize, v.len())).collect();
                // SAFETY: `mine` and every `got` vector outlive the call, distinct Vecs (the
                // root's outputs; the others pass none).
                unsafe { c.gather((mine.as_ptr() as usize, mine.len()), if me == root { &r } else { &[] }, root) }.unwrap_or_else(|e| panic!("{ids:?} rank {me} gather to {root}: {e}"));
                let ins: Vec<Vec<u8>> = (0..w).map(|j| body(root, j, len(j, root) + 3)).collect();
                let s: Vec<_> = ins.iter().map(|v| (v.as_ptr() as usize, v.len())).collect();
                let mut sc = vec![0xEE; len(me, root) + 3];
                // SAFETY: `sc` and every `ins` vector outlive the call, distinct Vecs.
                unsafe { c.scatter(if me == root { &s } else { &[] }, (sc.as_mut_ptr() as usize, sc.len()), root) }.unwrap_or_else(|e| panic!("{ids:?} rank {me} scatter from {root}: {e}"));
                per_root.push((if me == root { got } else { Vec::new() }, sc));
            }
            (per_root, c.connected())
        });
        for (me, (per_root, connected)) in out.into_iter().enumerate() {
            for (root, (got, sc)) in per_root.into_iter().enumerate() {
                if me == root {
                    for (j, g) in got.iter().enumerate() {
                        assert!(*g == body(j, root, len(j, root)), "{ids:?}: gather to {root}: piece of {j}");
                    }
                }
                assert!(sc == body(root, me, len(me, root) + 3), "{ids:?}: scatter from {root} to {me}");
            }
            if leaders.contains(&me) {
                assert!(connected.iter().all(|r| leaders.contains(r)), "{ids:?}: leader {me} connected to {connected:?}");
            } else {
                assert_eq!(connected, Vec::<usize>::new(), "{ids:?}: rank {me} leads no host, yet holds TCP connections");
            }
        }
    }
}

/// Across two hosts from `GATHER_RING_MIN` bytes per chunk (no ring there), all_gather and
/// reduce_scatter stay a direct exchange, whose scratch is bounded: exact results, and a rank
/// that leads no host did reach the other host's ranks itself.
#[test]
fn large_gathers_across_two_hosts_exchange_directly() {
    let ids: &[&str] = &["a", "b", "a", "b"];
    let w = ids.len();
    let n = wirespeed_core::testing::GATHER_RING_MIN / 8;
    let out = with_hosts(ids, move |c| {
        let me = c.rank;
        let mine = input(me, n);
        let mut all = vec![0i64; n * w];
        let recv: Vec<(usize, usize)> = (0..w).map(|j| (all.as_mut_ptr() as usize + j * n * 8, n * 8)).collect();
        // SAFETY: `mine` and `all` outlive the call; `recv` cuts `all` into disjoint runs.
        unsafe { c.all_gather((mine.as_ptr() as usize, n * 8), &recv) }.unwrap();
        let rs_in = input(me + 1, n * w);
        let mut rs_out = vec![0i64; n];
        let rs: Vec<_> = (0..w).map(|j| (rs_in.as_ptr() as usize + j * n * 8, n * 8)).collect();
        // SAFETY: `rs_in` and `rs_out` outlive the call; `rs` cuts `rs_in` into runs.
        unsafe { c.reduce_scatter(&rs, rs_out.as_mut_ptr() as usize, n, DType::I64, ReduceOp::Sum) }.unwrap();
        (all, rs_out, c.connected())
    });
    let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r + 1, n * w)).collect();
    for (me, (all, rs_out, connected)) in out.into_iter().enumerate() {
        assert!(all == (0..w).flat_map(|j| input(j, n)).collect::<Vec<_>>(), "all_gather on {me}");
        assert!(rs_out == (0..n).map(|i| ins.iter().map(|v| v[me * n + i]).sum::<i64>()).collect::<Vec<_>>(), "reduce_scatter on {me}");
        if me == 2 {
            assert_eq!(connected, vec![1, 3], "rank 2 (host a's second) exchanged with host b's ranks");
        }
    }
}
