//! Ordered, asynchronous execution of a group's ops, so `async_op=True` work progresses in the
//! background while the caller computes (DDP overlaps gradient all_reduce with backward).
//!
//! Ops run strictly in submission order, one at a time, by whoever gets there first: a background
//! worker thread, or a caller waiting on an op that has not started (it then runs the queue up to
//! its op itself). A blocking call (`run`) costs no thread hand-off: it queues without waking the
//! worker and runs the op inline, so a small collective touches no other thread of this process
//! (a wake-up costs ~30 us here, and on an oversubscribed host the worker would compete with the
//! peers for a core). Only async ops (`submit`) wake the worker. Op `id` is complete iff
//! `completed >= id`, because completion is in order too.
use crate::collectives::Buf;
use crate::comm::Comm;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::group::Collectives;
use crate::p2p::Ticket;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An op with raw buffer addresses; the caller keeps the buffers alive until the op completes.
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

enum Outcome {
    Failed(Error),
    SendPending(Ticket),
}

#[derive(Default)]
struct State {
    queue: VecDeque<(u64, Op)>,
    next_id: u64,
    /// Only ops that did not simply succeed: errors, and sends still awaiting their receiver.
    outcomes: BTreeMap<u64, Outcome>,
    shutdown: bool,
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

/// How many finished outcomes are kept for late waits (an op older than that completed long ago).
const KEEP_OUTCOMES: usize = 4096;

/// # Safety
/// The op's buffers are valid as `Collectives` requires (`Engine::submit`'s contract).
unsafe fn execute(comm: &mut dyn Collectives, op: Op) -> Result<Option<Ticket>> {
    // SAFETY: the caller's contract is each method's.
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

impl Shared {
    /// Run queued ops in order while holding the execution lock; stop after `until` (if given).
    fn drain(&self, comm: &mut dyn Collectives, until: Option<u64>) {
        loop {
            let next = self.state.lock().unwrap().queue.pop_front();
            let Some((id, op)) = next else { return };
            // A bug must not unwind into Python (or poison the group's lock): it becomes this
            // op's error, and the group is broken like after any other failure.
            // SAFETY: ops were queued by submit/run, whose callers vouched for their buffers.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { execute(&mut *comm, op) }))
                .unwrap_or_else(|p| {
                    let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
                    Err(Error::Broken(format!("internal error in wirespeed ({why}); please report it")))
                });
            {
                let mut st = self.state.lock().unwrap();
                match r {
                    Ok(None) => {}
                    Ok(Some(t)) => {
                        st.outcomes.insert(id, Outcome::SendPending(t));
                    }
                    Err(e) => {
                        st.outcomes.insert(id, Outcome::Failed(e));
                    }
                }
                while st.outcomes.len() > KEEP_OUTCOMES {
                    st.outcomes.pop_first();
                }
                self.completed.store(id, Release);
            }
            self.done.notify_all();
            if until.is_some_and(|u| id >= u) {
                return;
            }
        }
    }
}

impl Engine {
    pub fn new(comm: Comm) -> Result<Engine> {
        Engine::with(Box::new(comm))
    }

    /// An engine over any group (one host's `Comm`, or a multi-host group from `Setup::connect`).
    pub fn with(comm: Box<dyn Collectives>) -> Result<Engine> {
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
        let wake_worker = std::env::var("WIRESPEED_WORKER").map(|v| v != "0").unwrap_or(true);
        Ok(Engine { shared, worker: Some(worker), wake_worker })
    }

    pub fn rank(&self) -> usize {
        self.shared.comm.lock().unwrap().rank()
    }

    /// Queue an op to progress in the background; returns its id for `wait`/`is_done`.
    /// # Safety
    /// The op's buffers stay valid, and untouched by anyone else, until the op completes
    /// (`wait` or `is_done`), as `Collectives` requires.
    pub unsafe fn submit(&self, op: Op) -> u64 {
        let id = self.enqueue(op);
        if self.wake_worker {
            self.shared.work.notify_one();
        }
        id
    }

    /// Run an op to completion in this thread (after any ops queued before it); returns its id.
    /// # Safety
    /// As `submit`, until this returns.
    pub unsafe fn run(&self, op: Op) -> Result<u64> {
        let id = self.enqueue(op);
        self.wait(id).map(|_| id)
    }

    fn enqueue(&self, op: Op) -> u64 {
        let mut st = self.shared.state.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        st.queue.push_back((id, op));
        id
    }

    pub fn is_done(&self, id: u64) -> bool {
        if self.shared.completed.load(Acquire) < id {
            return false;
        }
        match self.shared.state.lock().unwrap().outcomes.get(&id) {
            Some(Outcome::SendPending(t)) => t.is_acked(),
            _ => true,
        }
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
                    let st = sh.state.lock().unwrap();
                    if sh.completed.load(Acquire) < id {
                        let _ = sh.done.wait_timeout(st, Duration::from_millis(5)).unwrap();
                    }
                }
                Err(TryLockError::Poisoned(_)) => {
                    return Err(Error::Broken("a wirespeed worker panicked".into()));
                }
            }
        }
        let outcome = sh.state.lock().unwrap().outcomes.remove(&id);
        match outcome {
            None => Ok(()),
            Some(Outcome::Failed(e)) => {
                // Keep the error for a second wait on the same work.
                sh.state.lock().unwrap().outcomes.insert(id, Outcome::Failed(e.clone()));
                Err(e)
            }
            Some(Outcome::SendPending(t)) => {
                let r = t.wait();
                if let Err(e) = &r {
                    sh.state.lock().unwrap().outcomes.insert(id, Outcome::Failed(e.clone()));
                }
                r
            }
        }
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
    }
}
