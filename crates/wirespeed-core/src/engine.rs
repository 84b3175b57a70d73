//! Ordered, asynchronous execution of a group's ops, so `async_op=True` work progresses in the
//! background while the caller computes (DDP overlaps gradient all_reduce with backward).
//!
//! Ops run strictly in submission order, one at a time, by whoever gets there first: a background
//! worker thread, or a caller waiting on an op that has not started (it then runs the queue up to
//! its op itself). A blocking call (`run`) costs no thread hand-off: it queues without waking the
//! worker and runs the op inline, so a small collective touches no other thread of this process
//! (a wake-up costs ~30 us here, and on an oversubscribed host the worker would compete with the
//! peers for a core). Only async ops (`submit`) wake the worker. Op `id` has run iff
//! `completed >= id`, because completion is in order too; a send is complete when its receiver
//! has also taken the bytes.
//!
//! **Ownership.** Every op is queued with its `Owner`: whatever keeps its buffers alive (for the
//! Python bindings, the tensors and staging copies behind the addresses). The engine, not the
//! caller, decides when that may go: it drops the owner when no one can touch the buffers any
//! more (the op ran, and a send's receiver acknowledged it), and keeps it for the engine's life
//! when the op failed, since a peer that is only late (a receiver reading a timed-out send, a
//! root writing into a receiver that gave up) may still reach the memory. Whatever is still
//! held that way when the engine is dropped is leaked, not freed. So a caller that drops its own
//! handle to an op early (a Python Work, a temporary input) cannot free memory the op uses: the
//! owner travels with the op, whatever wraps, joins or forgets the handle. What a caller of
//! `submit` or `run` promises in return is their `# Safety` section (the owner contract).
use crate::api::{Buf, Collectives, Kind, Ticket};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An op with raw buffer addresses; the `Owner` queued with it keeps them alive.
pub enum Op {
    AllReduce { buf: usize, count: usize, dtype: DType, op: ReduceOp },
    ReduceScatter { send: Vec<Buf>, out: usize, count: usize, dtype: DType, op: ReduceOp },
    Reduce { buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize },
    AllGather { send: Buf, recv: Vec<Buf> },
    AllToAll { send: Vec<Buf>, recv: Vec<Buf> },
    Broadcast { buf: Buf, root: usize },
    Gather { send: Buf, recv: Vec<Buf>, root: usize },
    Scatter { send: Vec<Buf>, recv: Buf, root: usize },
    Barrier,
    Send { to: usize, buf: Buf, tag: u64 },
    Recv { from: usize, buf: Buf, tag: u64 },
}

impl Op {
    /// The collective this op runs (None for point-to-point, which has no descriptor or tag
    /// kind): the same name the groups put in their descriptors and tags.
    pub fn kind(&self) -> Option<Kind> {
        Some(match self {
            Op::AllReduce { .. } => Kind::AllReduce,
            Op::ReduceScatter { .. } => Kind::ReduceScatter,
            Op::Reduce { .. } => Kind::Reduce,
            Op::AllGather { .. } => Kind::AllGather,
            Op::AllToAll { .. } => Kind::AllToAll,
            Op::Broadcast { .. } => Kind::Broadcast,
            Op::Gather { .. } => Kind::Gather,
            Op::Scatter { .. } => Kind::Scatter,
            Op::Barrier => Kind::Barrier,
            Op::Send { .. } | Op::Recv { .. } => return None,
        })
    }
}

/// What keeps an op's buffers valid (the memory behind its addresses, and any temporaries the
/// caller made for it), handed to the engine with the op; see the module's note on ownership.
pub type Owner = Box<dyn Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<(u64, Op, Owner)>,
    next_id: u64,
    /// Sends that ran but whose receiver has not taken the bytes yet, with their owners: the
    /// receiver reads the send buffer until it acknowledges. Never forgotten before that.
    sends: BTreeMap<u64, (Arc<Ticket>, Owner)>,
    /// Errors of failed ops, for late (and repeated) waits; past KEEP_FAILURES the oldest are
    /// forgotten, and `forgotten_upto` says which ids may have been among them.
    failures: BTreeMap<u64, Error>,
    forgotten_upto: u64,
    /// Owners of failed ops: a late peer may still touch their memory, so they are never freed.
    retained: Vec<Owner>,
    shutdown: bool,
    /// A send's wait failed outside the comm lock: break the group with this before the next op
    /// runs (`Shared::abort`).
    abort: Option<Error>,
    /// Threads asleep on `done`: completing an op wakes them only if there are any (an
    /// unconditional notify is a futex system call per op, most of a small op's engine cost).
    done_waiters: usize,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    completed: AtomicU64,
    comm: Mutex<Box<dyn Collectives>>,
}

pub struct Engine {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    wake_worker: bool,
}

/// How many failed ops' errors are kept for late waits. A failure breaks the group, so every
/// later op fails too; past this many, a wait on a forgotten id reports that instead of success.
const KEEP_FAILURES: usize = 4096;

/// # Safety
/// `op`'s buffers meet `Collectives`' contract (api.rs) for this call and, for a send, until its
/// ticket completes: the owner contract (`Engine::submit`) under which it was queued.
unsafe fn execute(comm: &mut dyn Collectives, op: Op) -> Result<Option<Ticket>> {
    // SAFETY: this function's contract is `Collectives`': each arm passes the op's own buffers,
    // unchanged, to the method of the same name.
    unsafe {
        match op {
            Op::AllReduce { buf, count, dtype, op } => comm.all_reduce(buf, count, dtype, op).map(|_| None),
            Op::ReduceScatter { send, out, count, dtype, op } => comm.reduce_scatter(&send, out, count, dtype, op).map(|_| None),
            Op::Reduce { buf, count, dtype, op, root } => comm.reduce(buf, count, dtype, op, root).map(|_| None),
            Op::AllGather { send, recv } => comm.all_gather(send, &recv).map(|_| None),
            Op::AllToAll { send, recv } => comm.all_to_all(&send, &recv).map(|_| None),
            Op::Broadcast { buf, root } => comm.broadcast(buf, root).map(|_| None),
            Op::Gather { send, recv, root } => comm.gather(send, &recv, root).map(|_| None),
            Op::Scatter { send, recv, root } => comm.scatter(&send, recv, root).map(|_| None),
            Op::Barrier => comm.barrier().map(|_| None),
            Op::Send { to, buf, tag } => comm.send_post(to, buf.0, buf.1, tag).map(Some),
            Op::Recv { from, buf, tag } => comm.recv(from, buf.0, buf.1, tag).map(|_| None),
        }
    }
}

impl State {
    /// Record op `id`'s failure; its owner is kept for good (a late peer may still use the memory).
    fn fail(&mut self, id: u64, e: Error, owner: Owner) {
        self.failures.insert(id, e);
        self.retained.push(owner);
        while self.failures.len() > KEEP_FAILURES {
            if let Some((old, _)) = self.failures.pop_first() {
                self.forgotten_upto = self.forgotten_upto.max(old);
            }
        }
    }

    /// The error to report for op `id`, which has run and is not a pending send.
    fn outcome(&self, id: u64) -> Result<()> {
        match self.failures.get(&id) {
            Some(e) => Err(e.clone()),
            None if id <= self.forgotten_upto => Err(Error::Broken(format!(
                "op {id}'s outcome was forgotten after more than {KEEP_FAILURES} later ops failed"
            ))),
            None => Ok(()),
        }
    }
}

impl Shared {
    /// Break the group after a send's wait failed: the receiver may still come, and must fail
    /// rather than take the bytes (nor may the TCP reactor keep sending them). Called holding
    /// no lock.
    fn abort(&self, e: &Error, block: bool) {
        // A thread draining the queue applies it before its next op: ops queued behind the send
        // then fail at once instead of running, so the drain, and the blocking lock below that
        // waits for it, end within the op in progress. `is_done` does not block (the bindings
        // call it holding Python's GIL, and the op in progress may wait on a peer that needs a
        // Python thread of this process): it leaves the abort to the drain when the lock is taken.
        self.state.lock().unwrap().abort = Some(e.clone());
        let mut comm = if block {
            self.comm.lock().unwrap_or_else(|p| p.into_inner())
        } else {
            match self.comm.try_lock() {
                Ok(c) => c,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            }
        };
        // Comm, then state: the drain's order, so no deadlock.
        let pending = self.state.lock().unwrap().abort.take();
        if let Some(e) = pending {
            comm.abort(&e);
        }
    }

    /// Run queued ops in order while holding the execution lock; stop after `until` (if given).
    fn drain(&self, comm: &mut dyn Collectives, until: Option<u64>) {
        loop {
            let (next, abort) = {
                let mut st = self.state.lock().unwrap();
                (st.queue.pop_front(), st.abort.take())
            };
            if let Some(e) = abort {
                comm.abort(&e);
            }
            let Some((id, op, owner)) = next else { return };
            // A bug must not unwind into Python (or poison the group's lock): it becomes this
            // op's error, and the group is broken like after any other failure (the groups
            // catch panics in their collectives themselves; this covers every other path).
            // SAFETY: only `submit` and `run` queue ops (`enqueue` is private), so the owner
            // contract holds for this one: its memory is valid and ours alone until it completes,
            // which is no earlier than this call (a send's owner moves to `sends` below).
            let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { execute(&mut *comm, op) })) {
                Ok(r) => r,
                Err(p) => {
                    let e = Error::from_panic(p);
                    comm.abort(&e);
                    Err(e)
                }
            };
            let (wake, free) = {
                let mut st = self.state.lock().unwrap();
                let free = match r {
                    Ok(None) => Some(owner),
                    Ok(Some(t)) => {
                        st.sends.insert(id, (Arc::new(t), owner));
                        None
                    }
                    Err(e) => {
                        st.fail(id, e, owner);
                        None
                    }
                };
                self.completed.store(id, Release);
                (st.done_waiters > 0, free)
            };
            // Outside the lock: dropping an owner may run its destructor (a Python object's).
            drop(free);
            if wake {
                self.done.notify_all();
            }
            if until.is_some_and(|u| id >= u) {
                return;
            }
        }
    }
}

impl Engine {
    /// An engine over any group (one host's `Comm`, or a multi-host group from `Setup::connect`).
    /// `wake_worker` (`Config::wake_worker`, WIRESPEED_WORKER): whether `submit` wakes the
    /// worker; without, an async op progresses only when waited on or when another op is queued.
    pub fn with(comm: Box<dyn Collectives>, wake_worker: bool) -> Result<Engine> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { next_id: 1, ..State::default() }),
            work: Condvar::new(),
            done: Condvar::new(),
            completed: AtomicU64::new(0),
            comm: Mutex::new(comm),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name("wirespeed-worker".into())
            .spawn(move || worker_loop(&s))
            .map_err(|e| Error::Unsupported(format!("cannot start wirespeed's worker thread ({e}): raise the process's thread limit")))?;
        Ok(Engine { shared, worker: Some(worker), wake_worker })
    }

    pub fn rank(&self) -> usize {
        self.shared.comm.lock().unwrap().rank()
    }

    /// The group's TCP streams to other hosts now (`Collectives::tcp_streams`); waits for an op
    /// in progress, so ask between ops.
    pub fn tcp_streams(&self) -> usize {
        self.shared.comm.lock().unwrap().tcp_streams()
    }

    /// Queue an op to progress in the background; returns its id for `wait`/`is_done`.
    ///
    /// Ownership: `owner` keeps the op's memory valid (the engine drops it only when nobody can
    /// touch the memory any more, and never if the op failed: module note, "Ownership"), or the
    /// caller does, and must then keep it for the engine's life if the op fails (`retain`).
    ///
    /// # Safety
    /// The owner contract above, `run`'s too: every address in `op` meets `Collectives`'
    /// buffer contract (api.rs) until the op is complete (`wait` Ok, or `is_done` true); until
    /// then nothing but the engine writes the memory or reads an output.
    pub unsafe fn submit(&self, op: Op, owner: Owner) -> u64 {
        let id = self.enqueue(op, owner);
        if self.wake_worker {
            self.shared.work.notify_one();
        }
        id
    }

    /// Run an op to completion in this thread (after any ops queued before it); returns its id.
    ///
    /// # Safety
    /// The owner contract (`submit`). The op is complete when this returns Ok, so memory the
    /// caller keeps itself (an empty `owner`) may go then; after an error it must be kept for the
    /// engine's life, as a failed op's `owner` is.
    pub unsafe fn run(&self, op: Op, owner: Owner) -> Result<u64> {
        let id = self.enqueue(op, owner);
        self.wait(id).map(|_| id)
    }

    fn enqueue(&self, op: Op, owner: Owner) -> u64 {
        let mut st = self.shared.state.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        st.queue.push_back((id, op, owner));
        id
    }

    /// Whether op `id` completed (for a send: its receiver took the bytes). A send found
    /// acknowledged here gives its owner back at once.
    pub fn is_done(&self, id: u64) -> bool {
        if self.shared.completed.load(Acquire) < id {
            return false;
        }
        let (freed, failed) = {
            let mut st = self.shared.state.lock().unwrap();
            match st.sends.get(&id) {
                Some((t, _)) if t.is_acked() => {
                    // Finished: its wait returns at once, with the send's own outcome.
                    let r = t.wait();
                    let (_, owner) = st.sends.remove(&id).expect("looked up under this lock");
                    match r {
                        Ok(()) => (Some(owner), None),
                        Err(e) => {
                            st.fail(id, e.clone(), owner);
                            (None, Some(e))
                        }
                    }
                }
                Some(_) => return false,
                None => (None, None),
            }
        };
        drop(freed);
        if let Some(e) = failed {
            self.shared.abort(&e, false);
        }
        true
    }

    /// Break the group from outside its ops (a rank of the job found to be another process):
    /// the next op fails with `e`, and peers waiting on this rank learn it as they do after any
    /// failure here. Does not block on an op in progress: the drain applies it before its next
    /// op, so an op already waiting on a peer ends as that wait does (the peer, or the timeout).
    pub fn abort(&self, e: Error) {
        self.shared.abort(&e, false);
    }

    /// Keep `owner` for the engine's life, as a failed op's: for a caller that held an op's memory
    /// itself through a blocking `run` (an empty owner) and must not let it go now that the op
    /// failed.
    pub fn retain(&self, owner: Owner) {
        self.shared.state.lock().unwrap().retained.push(owner);
    }

    /// How many ops' owners the engine holds because their ops failed, and how many sends are
    /// still waiting for their receivers (for tests and diagnostics).
    pub fn held(&self) -> (usize, usize) {
        let st = self.shared.state.lock().unwrap();
        (st.retained.len(), st.sends.len())
    }

    /// Block until op `id` completes (running queued ops inline if nobody else is); its error, if any.
    pub fn wait(&self, id: u64) -> Result<()> {
        let sh = &*self.shared;
        let start = Instant::now();
        while sh.completed.load(Acquire) < id {
            match sh.comm.try_lock() {
                Ok(mut comm) => {
                    sh.drain(&mut **comm, Some(id));
                    drop(comm);
                    // Ops queued behind ours are the worker's again.
                    if !sh.state.lock().unwrap().queue.is_empty() {
                        sh.work.notify_one();
                    }
                }
                Err(TryLockError::WouldBlock) => {
                    // Another thread runs the queue: spin briefly, then sleep until an op completes.
                    if start.elapsed() < Duration::from_micros(50) {
                        std::hint::spin_loop();
                        continue;
                    }
                    let mut st = sh.state.lock().unwrap();
                    if sh.completed.load(Acquire) < id {
                        st.done_waiters += 1;
                        let (mut st, _) = sh.done.wait_timeout(st, Duration::from_millis(5)).unwrap();
                        st.done_waiters -= 1;
                    }
                }
                Err(TryLockError::Poisoned(_)) => {
                    return Err(Error::Broken("a wirespeed worker panicked".into()));
                }
            }
        }
        let send = {
            let st = sh.state.lock().unwrap();
            match st.sends.get(&id) {
                Some((t, _)) => t.clone(),
                None => return st.outcome(id),
            }
        };
        // A send: wait for its receiver (outside the lock; the entry stays, so `is_done` says
        // false meanwhile), then give its owner back, or keep it if the receiver never came.
        let r = send.wait();
        if let Err(e) = &r {
            sh.abort(e, true);
        }
        let freed = {
            let mut st = sh.state.lock().unwrap();
            match st.sends.remove(&id) {
                Some((_, owner)) => match &r {
                    Ok(()) => Some(owner),
                    Err(e) => {
                        st.fail(id, e.clone(), owner);
                        None
                    }
                },
                // Another thread finished it first and recorded what it found.
                None => return st.outcome(id),
            }
        };
        drop(freed);
        r
    }
}

fn worker_loop(sh: &Shared) {
    loop {
        {
            let mut st = sh.state.lock().unwrap();
            while st.queue.is_empty() && !st.shutdown {
                st = sh.work.wait(st).unwrap();
            }
            if st.shutdown {
                return;
            }
        }
        match sh.comm.try_lock() {
            Ok(mut comm) => sh.drain(&mut **comm, None),
            // A caller runs the queue inline; it hands back (notifies) if ops remain after its own.
            Err(_) => {
                let st = sh.state.lock().unwrap();
                let _ = sh.work.wait_timeout(st, Duration::from_millis(1)).unwrap();
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().shutdown = true;
        self.shared.work.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        // Ops never started are nobody's concern; their owners go with the queue. A send not yet
        // taken, or a failed op, may still be reached by a peer after this group is gone: leak
        // what keeps their memory, rather than free it under a late reader or writer.
        let mut st = self.shared.state.lock().unwrap();
        for (_, (_, owner)) in std::mem::take(&mut st.sends) {
            std::mem::forget(owner);
        }
        for owner in std::mem::take(&mut st.retained) {
            std::mem::forget(owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every collective kind can be queued: a kind added to api.rs without its `Op` fails here.
    #[test]
    fn every_kind_has_an_op() {
        let (b, v) = ((0, 0), Vec::new());
        let (d, o) = (DType::U8, ReduceOp::Sum);
        let ops = [
            Op::AllReduce { buf: 0, count: 0, dtype: d, op: o },
            Op::ReduceScatter { send: v.clone(), out: 0, count: 0, dtype: d, op: o },
            Op::Reduce { buf: 0, count: 0, dtype: d, op: o, root: 0 },
            Op::AllGather { send: b, recv: v.clone() },
            Op::AllToAll { send: v.clone(), recv: v.clone() },
            Op::Broadcast { buf: b, root: 0 },
            Op::Gather { send: b, recv: v.clone(), root: 0 },
            Op::Scatter { send: v, recv: b, root: 0 },
            Op::Barrier,
            Op::Send { to: 0, buf: b, tag: 0 },
            Op::Recv { from: 0, buf: b, tag: 0 },
        ];
        let kinds: Vec<Kind> = ops.iter().filter_map(Op::kind).collect();
        for k in Kind::ALL {
            assert_eq!(kinds.iter().filter(|&x| x == k).count(), 1, "{}", k.name());
        }
        assert_eq!(kinds.len(), Kind::ALL.len());
    }
}
