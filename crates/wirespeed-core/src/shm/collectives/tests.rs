//! The one-host collectives on ranks that are threads of this process.
use super::*;
use std::time::Duration;

/// Run `f` on `world` connected ranks (threads of this process); results in rank order.
fn with_ranks<T: Send + 'static>(world: usize, f: impl Fn(&mut Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    with_ranks_timeout(world, Duration::from_secs(20), f)
}

fn with_ranks_timeout<T: Send + 'static>(world: usize, timeout: Duration, f: impl Fn(&mut Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    crate::shm::threads::one_host(world, timeout, &crate::config::Config::default(), move |mut c| f(&mut c))
}

fn input(rank: usize, n: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 7 + rank * 13) % 101) as i64 - 50).collect()
}

/// Every one-host algorithm, forced, gives the exact sum / max / truncated mean on every rank,
/// for sizes around the chunk and block boundaries, and back-to-back ops of both slot parities
/// (a slot reused too early would show as a wrong second or third result).
#[test]
fn every_one_host_all_reduce_algorithm_is_exact() {
    for algo in [ShmAlgo::OneShot, ShmAlgo::Staged, ShmAlgo::Rsag] {
        for world in [1usize, 2, 3, 5] {
            let out = with_ranks(world, move |c| {
                c.tuning.shm_all_reduce = Some(algo);
                let mut res = vec![];
                for &n in &[0usize, 1, 7, 8, 9, 1000, 8193, 70_001] {
                    for (op, k) in [(ReduceOp::Sum, 0usize), (ReduceOp::Max, 1), (ReduceOp::Avg, 2)] {
                        let mut v: Vec<i64> = input(c.rank, n).iter().map(|x| x + k as i64).collect();
                        // SAFETY: `v` lives, untouched by anyone else, through the call.
                        unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::I64, op).unwrap() };
                        res.push(v);
                    }
                }
                res
            });
            let mut i = 0;
            for &n in &[0usize, 1, 7, 8, 9, 1000, 8193, 70_001] {
                for k in 0..3i64 {
                    let ins: Vec<Vec<i64>> = (0..world).map(|r| input(r, n).iter().map(|x| x + k).collect()).collect();
                    let want: Vec<i64> = (0..n)
                        .map(|e| {
                            let col = ins.iter().map(|v| v[e]);
                            match k {
                                0 => col.sum(),
                                1 => col.max().unwrap(),
                                _ => col.sum::<i64>() / world as i64,
                            }
                        })
                        .collect();
                    for (r, got) in out.iter().enumerate() {
                        assert_eq!(got[i], want, "{algo:?} world {world} n {n} op {k} rank {r}");
                    }
                    i += 1;
                }
            }
        }
    }
}

/// Broadcast between 2 ranks, staged or split (each rank copies half through
/// process_vm_readv/writev), from either root, at sizes around the staging limit and page
/// boundaries, back to back: every byte arrives, and the root's buffer is unchanged.
#[test]
fn two_rank_broadcast_is_exact_staged_and_split() {
    let sizes = [0usize, 1, 4096, crate::plan::PAIR_STAGE_MAX, crate::plan::PAIR_STAGE_MAX + 1, 100_003, (1 << 20) + 5];
    let fill = |root: usize, n: usize| -> Vec<u8> { (0..n).map(|i| ((i * 31 + root * 7) % 251) as u8).collect() };
    let out = with_ranks(2, move |c| {
        let mut got = vec![];
        for root in 0..2 {
            for &n in &sizes {
                let mut v = if c.rank == root { fill(root, n) } else { vec![0xEE; n] };
                // SAFETY: `v` lives, untouched by anyone else, through the call.
                unsafe { c.broadcast((v.as_mut_ptr() as usize, n), root).unwrap() };
                got.push(v);
            }
        }
        got
    });
    for (r, got) in out.iter().enumerate() {
        let mut i = 0;
        for root in 0..2 {
            for &n in &sizes {
                assert!(got[i] == fill(root, n), "rank {r} root {root} n {n}: wrong bytes");
                i += 1;
            }
        }
    }
}

/// Rank 0 reads rank 1 directly in an all_gather, then times out in the closing sync while
/// rank 1 stalls between its first sync and its reads; rank 0 returns the error and reuses
/// its buffer. Rank 1 then reads it: rank 0's phase is already past the closing sync, so
/// nothing else would stop rank 1 from returning what it read as rank 0's contribution.
#[test]
fn a_read_of_a_peer_that_gave_up_fails() {
    let both = std::sync::Arc::new(std::sync::Barrier::new(2));
    let out = with_ranks_timeout(2, Duration::from_secs(1), move |c| {
        let n = 1 << 20;
        c.tuning.stage_max = 0;
        let mut mine = vec![c.rank as u8 + 1; n];
        let mut all = vec![0u8; 2 * n];
        let recv = [(all.as_mut_ptr() as usize, n), (all.as_mut_ptr() as usize + n, n)];
        if c.rank == 0 {
            // SAFETY: `mine` and `all` outlive the call and nothing else touches them during
            // it; `recv` cuts `all` into two disjoint halves. (After the call fails, `mine` is
            // overwritten on purpose: rank 1's late read of it must fail.)
            let r = unsafe { c.all_gather((mine.as_ptr() as usize, n), &recv) };
            mine.fill(0xEE);
            both.wait();
            both.wait();
            r
        } else {
            // all_gather's exchange, up to its reads.
            let h = c.header(Kind::AllGather, None, None, 0, n as u64, 0);
            let sends = [(mine.as_ptr() as usize, n); 2];
            // SAFETY: `mine` is readable for `n` bytes until this closure ends (with
            // stage_max 0 it is not copied, only published for rank 0 to read in place).
            let pieces = unsafe { c.pieces(&sends, Mode::Copy) };
            let parity = c.publish_and_sync(h, &pieces).unwrap();
            both.wait();
            // SAFETY: recv[0] is the first `n` bytes of `all`, writable and touched by nothing
            // else; rank 0 published `n` bytes for this rank.
            let r = unsafe { c.fetch(parity, 0, sends[1].0, recv[0].0, n) };
            both.wait();
            r
        }
    });
    assert!(matches!(out[0], Err(Error::Timeout { .. })), "{:?}", out[0]);
    assert!(matches!(&out[1], Err(Error::PeerAborted { rank: 0, .. })), "{:?}", out[1]);
}

/// A rank that gave up (marked itself aborted, as a timed-out closing sync does before its
/// caller gets the buffer back) has nothing written into its memory afterwards: `write_to`,
/// through which the large all_reduce and broadcast_split fill peers' buffers, refuses.
#[test]
fn nothing_is_written_into_a_peer_that_gave_up() {
    let both = std::sync::Arc::new(std::sync::Barrier::new(2));
    let addr = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let out = with_ranks(2, move |c| {
        if c.rank == 1 {
            let v = vec![7u8; 4096];
            addr.store(v.as_ptr() as usize, std::sync::atomic::Ordering::SeqCst);
            c.fail(&Error::Broken("gave up".into()));
            both.wait();
            both.wait();
            Ok(v.iter().all(|&x| x == 7))
        } else {
            both.wait();
            let src = vec![9u8; 4096];
            let r = c.net.write_to(1, addr.load(std::sync::atomic::Ordering::SeqCst) as u64, src.as_ptr(), src.len());
            both.wait();
            r.map(|_| true)
        }
    });
    assert!(matches!(&out[0], Err(Error::PeerAborted { rank: 1, .. })), "{:?}", out[0]);
    assert!(matches!(out[1], Ok(true)), "rank 1's buffer was written: {:?}", out[1]);
}

/// A panic inside a collective (a bug) is its error, and breaks the group: peers are told
/// at once, and later ops fail.
#[test]
fn a_panic_in_a_collective_breaks_the_group() {
    let out = with_ranks(2, |c| {
        let t = std::time::Instant::now();
        let r = if c.rank == 0 { c.guarded(|_| panic!("a bug")) } else { c.barrier() };
        (r, c.barrier(), t.elapsed())
    });
    assert!(matches!(&out[0].0, Err(Error::Broken(m)) if m.contains("a bug")), "{:?}", out[0].0);
    assert!(matches!(out[0].1, Err(Error::Broken(_))), "{:?}", out[0].1);
    assert!(matches!(out[1].0, Err(Error::PeerAborted { rank: 0, .. })), "{:?}", out[1].0);
    assert!(out[1].2 < Duration::from_secs(5), "rank 1 waited {:?}", out[1].2);
}

/// Ranks tuned differently (one would stage a 2-rank broadcast the other splits) get a
/// mismatch error on both, never a half-filled buffer.
#[test]
fn ranks_choosing_different_broadcasts_get_an_error() {
    let out = with_ranks(2, |c| {
        if c.rank == 1 {
            c.tuning.stage_max = 0;
        }
        let mut v = vec![c.rank as u8; 8 << 10];
        // SAFETY: `v` lives, untouched by anyone else, through the call.
        unsafe { c.broadcast((v.as_mut_ptr() as usize, v.len()), 0) }.map_err(|e| e.to_string())
    });
    for (r, res) in out.iter().enumerate() {
        let e = res.as_ref().expect_err("a split and a staged broadcast must not pass");
        assert!(e.contains("chose algorithm"), "rank {r}: {e}");
    }
}
