//! Ranks as threads of one process: every rank's segment, sync and cross-memory read is real (a
//! process may process_vm_readv itself), only the processes are one. Multi-process behaviour (a
//! dead peer, torch integration) is tested from Python in tests/native.
mod common;

use common::{input, with_ranks, with_ranks_timeout};
use std::time::Duration;
use wirespeed_core::{Collectives, testing::Comm, Config, DType, Engine, Error, Op, ReduceOp};

#[test]
fn all_reduce_sums_exactly_for_every_size_and_algorithm() {
    for world in [1usize, 2, 3, 5] {
        for &n in &[0usize, 1, 3, 17, 1000, 70_000, 300_001] {
            let out = with_ranks(world, move |c| {
                let mut v = input(c.rank, n);
                // SAFETY: `v` holds `n` i64s and outlives the call; nothing else touches it.
                unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::I64, ReduceOp::Sum) }.unwrap();
                v
            });
            let inputs: Vec<Vec<i64>> = (0..world).map(|r| input(r, n)).collect();
            let want: Vec<i64> = (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
            for (r, got) in out.iter().enumerate() {
                assert_eq!(got, &want, "world {world} n {n} rank {r}");
            }
        }
    }
}

#[test]
fn gather_family_and_p2p_move_the_right_bytes() {
    let world = 4;
    let out = with_ranks(world, move |c| {
        let me = c.rank;
        let n = 1001usize;
        // all_gather
        let mine: Vec<i32> = (0..n).map(|i| (me * 10_000 + i) as i32).collect();
        let mut all = vec![0i32; n * world];
        let recv: Vec<(usize, usize)> = (0..world).map(|j| (all.as_mut_ptr() as usize + j * n * 4, n * 4)).collect();
        // SAFETY: `mine` (n i32s) and `all` outlive the call; `recv` cuts `all` into disjoint
        // runs of n i32s, one per rank; nothing else touches them.
        unsafe { c.all_gather((mine.as_ptr() as usize, n * 4), &recv) }.unwrap();
        // all_to_all: chunk j of rank r holds r*100+j
        let send: Vec<i32> = (0..world * 3).map(|k| (me * 100 + k / 3) as i32).collect();
        let mut got = vec![0i32; world * 3];
        let s: Vec<_> = (0..world).map(|j| (send.as_ptr() as usize + j * 12, 12)).collect();
        let r: Vec<_> = (0..world).map(|j| (got.as_mut_ptr() as usize + j * 12, 12)).collect();
        // SAFETY: `send` and `got` outlive the call; `s` and `r` cut them into disjoint 12-byte
        // runs, one per rank.
        unsafe { c.all_to_all(&s, &r) }.unwrap();
        // broadcast from 2
        let mut b = vec![me as u8; 5000];
        // SAFETY: `b` holds 5000 bytes and outlives the call; nothing else touches it.
        unsafe { c.broadcast((b.as_mut_ptr() as usize, 5000), 2) }.unwrap();
        // send/recv ring: post the send first, then receive, then wait for the ack
        let msg = vec![me as u64 + 7; 333];
        let mut inbox = vec![0u64; 333];
        // SAFETY: `msg` (333 u64s) outlives the ticket, waited below, and is not written.
        let t = unsafe { c.send_post((me + 1) % world, msg.as_ptr() as usize, 333 * 8, 0) }.unwrap();
        // SAFETY: `inbox` holds 333 u64s, written only by this call.
        unsafe { c.recv((me + world - 1) % world, inbox.as_mut_ptr() as usize, 333 * 8, 0) }.unwrap();
        t.wait().unwrap();
        c.barrier().unwrap();
        (all, got, b, inbox)
    });
    for (me, (all, got, b, inbox)) in out.into_iter().enumerate() {
        for j in 0..world {
            assert_eq!(all[j * 1001 + 5], (j * 10_000 + 5) as i32);
            assert_eq!(got[j * 3..j * 3 + 3], [(j * 100 + me) as i32; 3]);
        }
        assert!(b.iter().all(|&x| x == 2));
        assert!(inbox.iter().all(|&x| x == ((me + world - 1) % world) as u64 + 7));
    }
}

#[test]
fn mismatched_counts_raise_on_every_rank_and_the_group_survives() {
    let out = with_ranks(3, |c| {
        let n = if c.rank == 1 { 10 } else { 12 };
        let mut v = vec![1.0f32; 12];
        // SAFETY: `v` holds 12 >= n floats and outlives the call.
        let e = unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::F32, ReduceOp::Sum) }.unwrap_err();
        let mut w = vec![1.0f32; 4];
        // SAFETY: `w` holds the 4 floats passed and outlives the call.
        unsafe { c.all_reduce(w.as_mut_ptr() as usize, 4, DType::F32, ReduceOp::Sum) }.unwrap();
        (e, w)
    });
    for (e, w) in out {
        assert!(matches!(e, Error::Mismatch(_)), "{e}");
        assert_eq!(w, vec![3.0; 4]);
    }
}

#[test]
fn engine_runs_async_ops_in_order_in_the_background() {
    let out = with_ranks(2, |c| {
        // Move the connected comm into an engine (replace with a placeholder that is never used).
        let placeholder = Comm::new(0, 1, [0; 16], Duration::from_secs(1), &Config::default()).unwrap();
        let comm = std::mem::replace(c, placeholder);
        let e = Engine::with(Box::new(comm), true).unwrap();
        let mut a = vec![e.rank() as f64 + 1.0; 100_000];
        let mut b = vec![2.0f64; 10];
        // SAFETY: `a` and `b` are dropped before the engine, but only after both ops were waited
        // on (and succeeded): nothing owns more than they do, so the owners are empty.
        let ia = unsafe { e.submit(Op::AllReduce { buf: a.as_mut_ptr() as usize, count: a.len(), dtype: DType::F64, op: ReduceOp::Sum }, Box::new(())) };
        // SAFETY: as for `a`.
        let ib = unsafe { e.submit(Op::AllReduce { buf: b.as_mut_ptr() as usize, count: b.len(), dtype: DType::F64, op: ReduceOp::Prod }, Box::new(())) };
        // Nobody waits: the worker must finish both.
        let t0 = std::time::Instant::now();
        while !(e.is_done(ia) && e.is_done(ib)) {
            assert!(t0.elapsed() < Duration::from_secs(10), "background progress stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
        e.wait(ib).unwrap();
        e.wait(ia).unwrap();
        (a[99_999], b[0])
    });
    assert_eq!(out, vec![(3.0, 4.0), (3.0, 4.0)]);
}

/// An owner whose drop is seen from outside.
struct Flag(std::sync::Arc<std::sync::atomic::AtomicBool>);
impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn flag() -> (std::sync::Arc<std::sync::atomic::AtomicBool>, Flag) {
    let f = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    (f.clone(), Flag(f))
}

fn dropped(f: &std::sync::atomic::AtomicBool) -> bool {
    f.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn engine_holds_an_ops_owner_until_nobody_can_touch_its_buffers() {
    let out = with_ranks(2, |c| {
        let placeholder = Comm::new(0, 1, [0; 16], Duration::from_secs(1), &Config::default()).unwrap();
        let e = Engine::with(Box::new(std::mem::replace(c, placeholder)), true).unwrap();
        if e.rank() == 0 {
            // A send whose receiver comes late: the receiver reads the buffer until it acknowledges,
            // so the engine keeps the buffer (moved into the owner; its heap address is stable).
            let msg = vec![7u8; 100_000];
            let addr = msg.as_ptr() as usize;
            let (sent, owner) = flag();
            // SAFETY: the owner holds `msg`, whose heap memory is the op's buffer.
            let id = unsafe { e.submit(Op::Send { to: 1, buf: (addr, 100_000), tag: 5 }, Box::new((msg, owner))) };
            std::thread::sleep(Duration::from_millis(150));
            let early = (dropped(&sent), e.is_done(id));
            e.wait(id).unwrap();
            let after_ack = dropped(&sent);
            // A failed op (rank 1 sends 5 bytes, this receive expects 3): its owner is kept for the
            // engine's life, since a late peer could still reach the memory.
            let (failed, owner) = flag();
            let mut small = vec![0u8; 3];
            let addr = small.as_mut_ptr() as usize;
            // SAFETY: the owner holds `small`, whose heap memory is the op's 3-byte buffer.
            let id = unsafe { e.submit(Op::Recv { from: 1, buf: (addr, 3), tag: 6 }, Box::new((small, owner))) };
            let err = e.wait(id).is_err();
            let held = e.held();
            (0, vec![early.0, early.1, after_ack, err, dropped(&failed)], held.0)
        } else {
            std::thread::sleep(Duration::from_millis(400));
            let mut got = vec![0u8; 100_000];
            let (_, owner) = flag();
            // SAFETY: `got` outlives the op (waited below) and the engine's use of it.
            let id = unsafe { e.submit(Op::Recv { from: 0, buf: (got.as_mut_ptr() as usize, 100_000), tag: 5 }, Box::new(owner)) };
            e.wait(id).unwrap();
            let five = vec![1u8; 5];
            let addr = five.as_ptr() as usize;
            let (_, owner) = flag();
            // SAFETY: the owner holds `five`. Rank 0 refuses it and aborts, which ends this wait.
            let refused = unsafe { e.run(Op::Send { to: 0, buf: (addr, 5), tag: 6 }, Box::new((five, owner))) }.is_err();
            assert!(refused);
            (1, vec![got.iter().all(|&b| b == 7)], 0)
        }
    });
    let mut out = out;
    out.sort_by_key(|o| o.0);   // the placeholder comm left behind says rank 0 on both
    // rank 0: not dropped and not done before the ack; dropped after; the bad receive failed and
    // its owner is still held, one owner kept.
    assert_eq!(out[0], (0, vec![false, false, true, true, false], 1));
    assert_eq!(out[1], (1, vec![true], 0));
}

/// Take the connected comm out of `with_ranks`'s hands (a never-connected one is left behind).
fn take(c: &mut Comm) -> Comm {
    std::mem::replace(c, Comm::new(0, 1, [0; 16], Duration::from_secs(1), &Config::default()).unwrap())
}

/// Rank 0 posts a send, then gives up on the group (a barrier rank 1 never joins times out) and
/// reuses the buffer, as a caller may after an error. Rank 1 comes late: the message is posted,
/// so its wait takes the fast path, which does not look at peers. It must fail, not return what
/// now lies in rank 0's memory.
#[test]
fn a_receiver_fails_rather_than_read_a_send_whose_sender_gave_up() {
    let both = std::sync::Arc::new(std::sync::Barrier::new(2));
    let out = with_ranks_timeout(2, Duration::from_secs(1), move |c| {
        let n = 1 << 20;
        if c.rank == 0 {
            let mut msg = vec![7u8; n];
            // SAFETY: `msg` lives until rank 1 is done with it (the second `both`).
            let t = unsafe { c.send_post(1, msg.as_ptr() as usize, n, 9) }.unwrap();
            let gave_up = c.barrier().unwrap_err();
            assert!(matches!(gave_up, Error::Timeout { .. }), "{gave_up}");
            msg.fill(0xEE);
            both.wait();
            // Keep the group open until rank 1 has tried: closing it would tell rank 1 anyway.
            both.wait();
            drop(t);
            Ok(true)
        } else {
            both.wait();
            let mut got = vec![0u8; n];
            // SAFETY: `got` lives, untouched by anyone else, through the call.
            let r = unsafe { c.recv(0, got.as_mut_ptr() as usize, n, 9) };
            both.wait();
            r.map(|_| got.iter().all(|&b| b == 7))
        }
    });
    assert!(matches!(&out[1], Err(Error::PeerAborted { rank: 0, reason }) if reason.contains("timed out")), "{:?}", out[1]);
}

/// Closing a group with a send its receiver has not taken tells the receiver, which fails
/// instead of reading memory its owner may have freed.
#[test]
fn closing_the_group_fails_a_receiver_of_an_untaken_send() {
    let both = std::sync::Arc::new(std::sync::Barrier::new(2));
    let out = with_ranks(2, move |c| {
        let n = 1 << 20;
        if c.rank == 0 {
            let msg = vec![7u8; n];
            // SAFETY: `msg` lives until rank 1 is done, past the close; rank 1 must not read it.
            let t = unsafe { c.send_post(1, msg.as_ptr() as usize, n, 4) }.unwrap();
            drop(take(c));
            both.wait();
            both.wait();
            drop((t, msg));
            Ok(())
        } else {
            both.wait();
            let mut got = vec![0u8; n];
            let t0 = std::time::Instant::now();
            // SAFETY: `got` lives, untouched by anyone else, through the call.
            let r = unsafe { c.recv(0, got.as_mut_ptr() as usize, n, 4) };
            assert!(t0.elapsed() < Duration::from_secs(5));
            both.wait();
            r
        }
    });
    assert!(matches!(&out[1], Err(Error::PeerAborted { rank: 0, reason }) if reason.contains("closed")), "{:?}", out[1]);
}

/// Ranks that finished every op get no error when a peer closes the group right after: the
/// closing rank's flag is only seen by copies of its memory and waits on it still pending, and
/// ranks still busy among themselves (p2p) are no concern of it. Each round runs a direct
/// all_reduce, all_gather, p2p ring and broadcast (split on 2 ranks), each last in turn, and
/// rank 0 closes the moment its last op returns.
#[test]
fn closing_after_the_last_op_leaves_peers_unharmed() {
    for round in 0..24usize {
        let world = 2 + round % 2;
        let out = with_ranks(world, move |c| {
            let (me, n) = (c.rank, 1usize << 20);
            let mut ok = true;
            for k in 0..4 {
                ok &= match (round / 2 + k) % 4 {
                    0 => {
                        let mut v = input(me, n / 8);
                        // SAFETY: `v` holds v.len() i64s and outlives the call.
                        let r = unsafe { c.all_reduce(v.as_mut_ptr() as usize, v.len(), DType::I64, ReduceOp::Sum) };
                        r.is_ok() && v[5] == (0..world).map(|j| input(j, 6)[5]).sum::<i64>()
                    }
                    1 => {
                        let mine = vec![me as u8; n];
                        let mut all = vec![0u8; world * n];
                        let recv: Vec<(usize, usize)> = (0..world).map(|j| (all.as_mut_ptr() as usize + j * n, n)).collect();
                        // SAFETY: `mine` and `all` outlive the call; `recv` cuts `all` into
                        // disjoint runs.
                        let r = unsafe { c.all_gather((mine.as_ptr() as usize, n), &recv) };
                        r.is_ok() && (0..world).all(|j| all[j * n] as usize == j)
                    }
                    2 => {
                        let msg = vec![me as u8; n];
                        let mut inbox = vec![0u8; n];
                        // SAFETY: `msg` outlives the ticket if the receive succeeds (t.wait() runs
                        // before the block ends); if it fails, the group is broken first, and a
                        // late reader of `msg` then fails its read (`Net::after_copy`).
                        let t = unsafe { c.send_post((me + 1) % world, msg.as_ptr() as usize, n, 1) }.unwrap();
                        // SAFETY: `inbox` holds `n` bytes, written only by this call.
                        let r = unsafe { c.recv((me + world - 1) % world, inbox.as_mut_ptr() as usize, n, 1) };
                        r.is_ok() && t.wait().is_ok() && inbox.iter().all(|&b| b as usize == (me + world - 1) % world)
                    }
                    _ => {
                        let mut b = vec![me as u8; 2 * n];
                        // SAFETY: `b` holds 2n bytes and outlives the call.
                        let r = unsafe { c.broadcast((b.as_mut_ptr() as usize, 2 * n), round % world) };
                        r.is_ok() && b.iter().all(|&x| x as usize == round % world)
                    }
                };
            }
            if me == 0 {
                drop(take(c));
            }
            ok
        });
        assert_eq!(out, vec![true; world], "round {round}");
    }
}

/// A rank that closes the group while two others are busy among themselves (a send rank 2
/// takes only later) does not fail them: its flag fails only waits on it and reads of its memory.
#[test]
fn closing_does_not_fail_ranks_busy_among_themselves() {
    let all = std::sync::Arc::new(std::sync::Barrier::new(3));
    let closed = std::sync::Arc::new(std::sync::Barrier::new(2));
    let out = with_ranks(3, move |c| {
        let n = 1 << 20;
        match c.rank {
            0 => {
                all.wait();
                drop(take(c));
                closed.wait();
                Ok(())
            }
            1 => {
                let msg = vec![1u8; n];
                // SAFETY: `msg` outlives the ticket's wait.
                let t = unsafe { c.send_post(2, msg.as_ptr() as usize, n, 2) }.unwrap();
                all.wait();
                // Asleep (checking peers between slices) when rank 0 closes.
                t.wait()
            }
            _ => {
                all.wait();
                closed.wait();
                std::thread::sleep(Duration::from_millis(100));
                let mut got = vec![0u8; n];
                // SAFETY: `got` lives, untouched by anyone else, through the call.
                unsafe { c.recv(1, got.as_mut_ptr() as usize, n, 2) }
            }
        }
    });
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
}

/// A group whose barrier panics (a stand-in for a bug in a collective), counting aborts.
struct Panicky(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl wirespeed_core::Collectives for Panicky {
    fn rank(&self) -> usize {
        0
    }
    // SAFETY: unsafe only because `Collectives::all_reduce` is; this stub panics before it could touch a buffer
    unsafe fn all_reduce(&mut self, _: usize, _: usize, _: DType, _: ReduceOp) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::reduce_scatter` is; this stub panics before it could touch a buffer
    unsafe fn reduce_scatter(&mut self, _: &[(usize, usize)], _: usize, _: usize, _: DType, _: ReduceOp) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::reduce` is; this stub panics before it could touch a buffer
    unsafe fn reduce(&mut self, _: usize, _: usize, _: DType, _: ReduceOp, _: usize) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::all_gather` is; this stub panics before it could touch a buffer
    unsafe fn all_gather(&mut self, _: (usize, usize), _: &[(usize, usize)]) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::all_to_all` is; this stub panics before it could touch a buffer
    unsafe fn all_to_all(&mut self, _: &[(usize, usize)], _: &[(usize, usize)]) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::broadcast` is; this stub panics before it could touch a buffer
    unsafe fn broadcast(&mut self, _: (usize, usize), _: usize) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::gather` is; this stub panics before it could touch a buffer
    unsafe fn gather(&mut self, _: (usize, usize), _: &[(usize, usize)], _: usize) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::scatter` is; this stub panics before it could touch a buffer
    unsafe fn scatter(&mut self, _: &[(usize, usize)], _: (usize, usize), _: usize) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    fn barrier(&mut self) -> wirespeed_core::Result<()> {
        panic!("a bug")
    }
    // SAFETY: unsafe only because `Collectives::send_post` is; this stub panics before it could touch a buffer
    unsafe fn send_post(&mut self, _: usize, _: usize, _: usize, _: u64) -> wirespeed_core::Result<wirespeed_core::Ticket> {
        unimplemented!()
    }
    // SAFETY: unsafe only because `Collectives::recv` is; this stub panics before it could touch a buffer
    unsafe fn recv(&mut self, _: usize, _: usize, _: usize, _: u64) -> wirespeed_core::Result<()> {
        unimplemented!()
    }
    fn abort(&mut self, _: &Error) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A panic inside an op is that op's error, and the engine breaks the group for it, whichever
/// path of the group panicked.
#[test]
fn the_engine_breaks_the_group_when_an_op_panics() {
    let aborts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let e = Engine::with(Box::new(Panicky(aborts.clone())), true).unwrap();
    // SAFETY: no buffers.
    let r = unsafe { e.run(Op::Barrier, Box::new(())) };
    assert!(matches!(&r, Err(Error::Broken(m)) if m.contains("a bug")), "{r:?}");
    assert_eq!(aborts.load(std::sync::atomic::Ordering::SeqCst), 1);
}
