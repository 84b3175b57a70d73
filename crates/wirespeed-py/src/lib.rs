// pyo3 0.22's macros test a `gil-refs` feature this crate does not define, and expand to unsafe
// calls inside unsafe fns, which the workspace lint flags: both are the macros', not ours.
#![allow(unexpected_cfgs, unsafe_op_in_unsafe_fn)]
//! `wirespeed._native`: thin pyo3 bindings over wirespeed-core. Logic lives in the core; this crate
//! only converts types, maps each core error to its own Python exception, and releases the GIL
//! around anything that waits.
use pyo3::import_exception;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use wirespeed_core::Owner;
use wirespeed_core::FdRoom;
use wirespeed_core::{Config, DType, Engine, Error, Op, RankInfo, ReduceOp, Setup, StreamChoice};

// The exceptions are Python classes of wirespeed/errors.py, so that each is a member of the one
// hierarchy whose type says the kind of failure (a CollectiveTimeout is a PeerTimeout, exit
// status 3): no caller decides by a class name or a message. `WirespeedError` here is their base,
// errors.TransportError, which wirespeed.native exports under that name.
import_exception!(wirespeed.errors, TransportError);
import_exception!(wirespeed.errors, PeerDiedError);
import_exception!(wirespeed.errors, PeerAbortedError);
import_exception!(wirespeed.errors, CollectiveTimeout);
import_exception!(wirespeed.errors, MismatchError);
import_exception!(wirespeed.errors, UnsupportedError);
import_exception!(wirespeed.errors, StrangerError);
import_exception!(wirespeed.errors, BrokenGroupError);
type WirespeedError = TransportError;

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::PeerDied { .. } => PeerDiedError::new_err(msg),
        Error::PeerAborted { .. } | Error::PeerLost(_) => PeerAbortedError::new_err(msg),
        Error::Timeout { .. } => CollectiveTimeout::new_err(msg),
        Error::Mismatch(_) => MismatchError::new_err(msg),
        Error::Unsupported(_) => UnsupportedError::new_err(msg),
        Error::Stranger(_) => StrangerError::new_err(msg),
        Error::Broken(_) => BrokenGroupError::new_err(msg),
        Error::Os { .. } => WirespeedError::new_err(msg),
    }
}

fn dtype(code: u32) -> PyResult<DType> {
    DType::from_code(code).map_err(to_py)
}
fn rop(code: u32) -> PyResult<ReduceOp> {
    ReduceOp::from_code(code).map_err(to_py)
}
/// The dtype and op of a reduction, refused before the op starts if the op is not defined on the
/// dtype (every rank refuses it alike, so the group stays usable).
fn reduction(dtype_code: u32, op_code: u32) -> PyResult<(DType, ReduceOp)> {
    let (d, o) = (dtype(dtype_code)?, rop(op_code)?);
    wirespeed_core::check_reduction(d, o).map_err(to_py)?;
    Ok((d, o))
}

/// One rank's membership in a group: created unconnected (so its info can go through a store),
/// then connected, after which ops are submitted and awaited by id.
#[pyclass(module = "wirespeed._native", weakref)]
struct Group {
    pending: Mutex<Option<Setup>>,
    engine: Option<Engine>,
    rank: usize,
    world: usize,
    /// Ranks on more than one host: all_reduce then reduces in stages (hier.rs, ring.rs).
    spans_hosts: bool,
    /// Whether async ops wake the engine's worker (`Config::wake_worker`), for `connect`.
    wake_worker: bool,
    /// Across hosts, the TCP streams per peer chosen at setup and what chose them (the setup's
    /// report); None on one host or before `connect`.
    streams: Option<StreamChoice>,
}

impl Group {
    fn engine(&self) -> PyResult<&Engine> {
        self.engine.as_ref().ok_or_else(|| UnsupportedError::new_err("the group is not connected yet"))
    }
    /// Queue `op` (the worker progresses it; await it with `wait`), or with `blocking` run it to
    /// completion in this thread, GIL released: no thread hand-off, the lowest latency. `keep` is
    /// what owns the memory behind the op's addresses (the tensors, staging copies): the engine
    /// holds it until nobody can touch that memory any more (engine.rs, "Ownership"), so the op
    /// stays valid whatever the caller does with its own references or its Work.
    fn submit(&self, py: Python<'_>, op: Op, keep: PyObject, blocking: bool) -> PyResult<u64> {
        let e = self.engine()?;
        // `keep` is positional (keywords cost ~75 ns a call here); refuse what cannot own memory,
        // such as the `blocking` flag passed where `keep` goes.
        if !matches!(op, Op::Barrier) && (keep.is_none(py) || keep.bind(py).is_instance_of::<pyo3::types::PyBool>()) {
            return Err(UnsupportedError::new_err("keep must be what owns the op's buffers (the tensors), not None or a bool"));
        }
        // SAFETY: Python can only hand addresses over as integers. This module is private
        // (`wirespeed._native`); its callers (wirespeed.native's backend, the benchmarks) pass the
        // data_ptr() of tensors they checked (size, dtype, contiguity) and hand those tensors in
        // as `keep`, which stays alive for as long as the op may touch them: held by the engine
        // for a queued op; for a blocking one, by this frame until `run` returns (nothing touches
        // the memory after a success) and by the engine for good after a failure. A blocking op
        // so costs no deferred release of a Python object (~0.2 us at 4 KiB).
        if blocking {
            // SAFETY: `keep`, held by this frame until `run` returns, owns the op's buffers; nothing
            // touches them after a success, and after a failure `retain` hands `keep` to the engine.
            return py.allow_threads(|| unsafe { e.run(op, Box::new(())) }).map_err(|err| {
                e.retain(Box::new(keep));
                to_py(err)
            });
        }
        let owner: Owner = Box::new(keep);
        // SAFETY: `owner` holds the tensors behind the op's addresses; the engine keeps it until
        // nothing can touch them (engine.rs, `Engine::submit`'s `# Safety`).
        Ok(unsafe { e.submit(op, owner) })
    }
}

impl Group {
    /// The dtype of a reduction, refusing an 8-bit avg across hosts: there the algorithms
    /// (ring, tree, direct exchange) keep partial sums in the element type between stages, so
    /// the sum would wrap before the division. Every rank knows the hosts, so every rank refuses
    /// the same call and none is left waiting. (On one host the sum is taken in 32 bits.)
    /// The dtype and op of a reduction, refused where the kernels or the algorithm cannot do it.
    fn reducible(&self, dtype_code: u32, op: u32, what: &str) -> PyResult<(DType, ReduceOp)> {
        let (d, o) = reduction(dtype_code, op)?;
        if self.spans_hosts && o == ReduceOp::Avg && matches!(d, DType::I8 | DType::U8) {
            return Err(UnsupportedError::new_err(format!(
                "wirespeed: avg of {} across hosts would wrap before dividing; {what} a wider \
                 dtype (e.g. int32) with sum and divide by the world size",
                d.name())));
        }
        Ok((d, o))
    }
}

type Bufs = Vec<(usize, usize)>;

/// `world` runs of `each` bytes, back to back from `base`.
fn flat_pieces(base: usize, each: usize, world: usize, what: &str) -> PyResult<Bufs> {
    each.checked_mul(world)
        .and_then(|total| base.checked_add(total))
        .ok_or_else(|| UnsupportedError::new_err(format!("wirespeed: the {what} ({world} x {each} bytes) does not fit in the address space")))?;
    Ok((0..world).map(|r| (base + r * each, each)).collect())
}

#[pymethods]
impl Group {
    /// `hosts[r]` is rank r's host id (`host_id()`); ranks on one host use shared memory, ranks
    /// on others TCP. Without it every rank is taken to be on this host. `rooms[r]` is what rank
    /// r's `fd_room()` returned, exchanged with the host ids: a group across hosts sizes its
    /// sockets to every rank's open-file limit with them (without: unchecked). `knobs` are the
    /// core's WIRESPEED_* knobs given as data: each is read there before the environment (pass
    /// the same to `fd_room`).
    #[new]
    #[pyo3(signature = (rank, world, token, timeout_s, hosts=None, rooms=None, knobs=None))]
    fn new(rank: usize, world: usize, token: &[u8], timeout_s: f64, hosts: Option<Vec<String>>, rooms: Option<Vec<String>>,
           knobs: Option<HashMap<String, String>>) -> PyResult<Group> {
        let tok: [u8; 16] = token.try_into().map_err(|_| UnsupportedError::new_err("the job token must be 16 bytes"))?;
        if !(timeout_s > 0.0) {
            return Err(UnsupportedError::new_err(format!("timeout must be positive, got {timeout_s}")));
        }
        let hosts = hosts.unwrap_or_default();
        let spans_hosts = hosts.iter().any(|h| h != &hosts[0]);
        // The one read of the core's WIRESPEED_* knobs for this group (`knobs`, then the
        // environment); the core reads no variable.
        let cfg = Config::from_knobs(&knobs.unwrap_or_default()).map_err(to_py)?;
        // The engine's knobs and the connection mode, checked on every host, though only a group
        // across hosts uses them: a knob set wrong is refused where it is set, not taken silently
        // on one host and refused the day the job spans two.
        cfg.net.clone().map_err(to_py)?;
        cfg.lazy_connect.clone().map_err(to_py)?;
        let rooms = rooms.unwrap_or_default().iter().enumerate().map(|(r, t)| FdRoom::parse(t, r)).collect::<Result<Vec<_>, _>>().map_err(to_py)?;
        let comm = Setup::new(rank, world, tok, Duration::from_secs_f64(timeout_s), &hosts, &rooms, &cfg).map_err(to_py)?;
        Ok(Group { pending: Mutex::new(Some(comm)), engine: None, rank, world, spans_hosts, wake_worker: cfg.wake_worker, streams: None })
    }

    /// (pid, memfd number, host id, TCP address or ""): what peers need to connect to this rank.
    fn info(&self) -> PyResult<(i32, i32, String, String)> {
        let g = self.pending.lock().unwrap();
        let c = g.as_ref().ok_or_else(|| UnsupportedError::new_err("already connected"))?;
        let i = c.info();
        Ok((i.pid, i.fd, i.host, i.addr))
    }

    /// Map every rank's segment and sync with all of them (GIL released while waiting).
    fn connect(&mut self, py: Python<'_>, infos: Vec<(i32, i32, String, String)>) -> PyResult<()> {
        let setup = self.pending.lock().unwrap().take().ok_or_else(|| UnsupportedError::new_err("already connected"))?;
        let infos: Vec<RankInfo> = infos.into_iter().map(|(pid, fd, host, addr)| RankInfo { pid, fd, host, addr }).collect();
        let (group, report) = py.allow_threads(|| setup.connect(&infos)).map_err(to_py)?;
        self.streams = report.streams;
        self.engine = Some(Engine::with(group, self.wake_worker).map_err(to_py)?);
        Ok(())
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }
    /// Across hosts, the TCP streams per bandwidth peer as chosen at setup (the core's
    /// hosts/probe.rs): (opened, used, forced by WIRESPEED_NSTREAMS, the probe's seconds, its
    /// steps as (streams, bytes per second each way)); None for a group on one host.
    #[getter]
    #[allow(clippy::type_complexity)]
    fn streams(&self) -> Option<(usize, usize, bool, f64, Vec<(usize, f64)>)> {
        self.streams.as_ref().map(|s| (s.opened, s.used, s.forced, s.secs, s.steps.clone()))
    }
    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    #[pyo3(signature = (buf, count, dtype_code, op, keep, blocking=false))]
    fn all_reduce(&self, py: Python<'_>, buf: usize, count: usize, dtype_code: u32, op: u32, keep: PyObject, blocking: bool) -> PyResult<u64> {
        let (dtype, op) = self.reducible(dtype_code, op, "all_reduce")?;
        self.submit(py, Op::AllReduce { buf, count, dtype, op }, keep, blocking)
    }
    #[pyo3(signature = (send, out, count, dtype_code, op, keep, blocking=false))]
    fn reduce_scatter(&self, py: Python<'_>, send: Bufs, out: usize, count: usize, dtype_code: u32, op: u32, keep: PyObject, blocking: bool) -> PyResult<u64> {
        let (dtype, op) = self.reducible(dtype_code, op, "reduce_scatter")?;
        self.submit(py, Op::ReduceScatter { send, out, count, dtype, op }, keep, blocking)
    }
    /// reduce_scatter of one flat input (torch's reduce_scatter_tensor): rank r's piece is the
    /// `count` elements at `send` + r·count·element size. The pieces are laid out here rather
    /// than in Python, where a list of `world` tuples per call costs microseconds.
    #[pyo3(signature = (send, out, count, dtype_code, op, keep, blocking=false))]
    fn reduce_scatter_flat(&self, py: Python<'_>, send: usize, out: usize, count: usize, dtype_code: u32, op: u32, keep: PyObject, blocking: bool) -> PyResult<u64> {
        let (dtype, op) = self.reducible(dtype_code, op, "reduce_scatter")?;
        let each = count.checked_mul(dtype.size()).ok_or_else(|| UnsupportedError::new_err(format!("wirespeed: {count} elements overflow a byte count")))?;
        let send = flat_pieces(send, each, self.world, "reduce_scatter input")?;
        self.submit(py, Op::ReduceScatter { send, out, count, dtype, op }, keep, blocking)
    }
    /// all_gather into one flat output (torch's all_gather_into_tensor): rank r's `bytes` land at
    /// `recv` + r·bytes.
    #[pyo3(signature = (send, recv, bytes, keep, blocking=false))]
    fn all_gather_flat(&self, py: Python<'_>, send: usize, recv: usize, bytes: usize, keep: PyObject, blocking: bool) -> PyResult<u64> {
        let recv = flat_pieces(recv, bytes, self.world, "all_gather output")?;
        self.submit(py, Op::AllGather { send: (send, bytes), recv }, keep, blocking)
    }
    #[pyo3(signature = (buf, count, dtype_code, op, root, keep, blocking=false))]
    fn reduce(&self, py: Python<'_>, buf: usize, count: usize, dtype_code: u32, op: u32, root: usize, keep: PyObject, blocking: bool) -> PyResult<u64> {
        let (dtype, op) = self.reducible(dtype_code, op, "reduce")?;
        self.submit(py, Op::Reduce { buf, count, dtype, op, root }, keep, blocking)
    }
    #[pyo3(signature = (send, recv, keep, blocking=false))]
    fn all_gather(&self, py: Python<'_>, send: (usize, usize), recv: Bufs, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::AllGather { send, recv }, keep, blocking)
    }
    #[pyo3(signature = (send, recv, keep, blocking=false))]
    fn all_to_all(&self, py: Python<'_>, send: Bufs, recv: Bufs, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::AllToAll { send, recv }, keep, blocking)
    }
    #[pyo3(signature = (buf, root, keep, blocking=false))]
    fn broadcast(&self, py: Python<'_>, buf: (usize, usize), root: usize, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::Broadcast { buf, root }, keep, blocking)
    }
    #[pyo3(signature = (send, recv, root, keep, blocking=false))]
    fn gather(&self, py: Python<'_>, send: (usize, usize), recv: Bufs, root: usize, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::Gather { send, recv, root }, keep, blocking)
    }
    #[pyo3(signature = (send, recv, root, keep, blocking=false))]
    fn scatter(&self, py: Python<'_>, send: Bufs, recv: (usize, usize), root: usize, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::Scatter { send, recv, root }, keep, blocking)
    }
    /// (No buffers, so nothing to keep.)
    #[pyo3(signature = (blocking=false))]
    fn barrier(&self, py: Python<'_>, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::Barrier, py.None(), blocking)
    }
    #[pyo3(signature = (to, buf, tag, keep, blocking=false))]
    fn send(&self, py: Python<'_>, to: usize, buf: (usize, usize), tag: u64, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::Send { to, buf, tag }, keep, blocking)
    }
    #[pyo3(signature = (from, buf, tag, keep, blocking=false))]
    fn recv(&self, py: Python<'_>, from: usize, buf: (usize, usize), tag: u64, keep: PyObject, blocking: bool) -> PyResult<u64> {
        self.submit(py, Op::Recv { from, buf, tag }, keep, blocking)
    }

    /// Block until op `id` completes (GIL released); raises its error.
    fn wait(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        let e = self.engine()?;
        py.allow_threads(|| e.wait(id)).map_err(to_py)
    }

    fn is_done(&self, id: u64) -> PyResult<bool> {
        Ok(self.engine()?.is_done(id))
    }

    /// (owners kept because their ops failed, sends still waiting for their receivers): what the
    /// engine holds past the ops' completion (tests, diagnostics).
    fn held(&self) -> PyResult<(usize, usize)> {
        Ok(self.engine()?.held())
    }

    /// Break the group with `why` (wirespeed.native.admission: a rank of this job was claimed
    /// again): this rank's next op fails with it, and so do its peers' ops waiting on this rank.
    fn abort(&self, py: Python<'_>, why: String) -> PyResult<()> {
        let e = self.engine()?;
        // Breaking the group shuts its connections: not with the GIL held.
        py.allow_threads(|| e.abort(Error::Stranger(why)));
        Ok(())
    }

    /// TCP streams this rank holds to other hosts now (0 on one host; before `connect`, none):
    /// with connections made on first use, what its collectives so far have opened.
    fn tcp_streams(&self, py: Python<'_>) -> usize {
        // (waits for an op in progress: not with the GIL held)
        self.engine.as_ref().map_or(0, |e| py.allow_threads(|| e.tcp_streams()))
    }

    /// Whether `close` ran (the claims watch stops watching a closed group).
    #[getter]
    fn closed(&self) -> bool {
        self.engine.is_none() && self.pending.lock().unwrap().is_none()
    }

    /// Stop the worker and unmap everything (also happens when the object is collected).
    fn close(&mut self, py: Python<'_>) {
        if let Some(e) = self.engine.take() {
            py.allow_threads(move || drop(e));
        }
    }
}

/// Version of the native core this module was built from.
#[pyfunction]
fn core_version() -> &'static str {
    wirespeed_core::version()
}

/// This machine's id (hostname + boot id, or WIRESPEED_HOSTID): ranks with equal ids share memory.
/// With `knobs`, the id a group given those knobs takes (their WIRESPEED_HOSTID first).
#[pyfunction]
#[pyo3(signature = (knobs=None))]
fn host_id(knobs: Option<HashMap<String, String>>) -> String {
    match knobs {
        Some(k) => wirespeed_core::host_id_from_knobs(&k),
        None => wirespeed_core::host_id_from_env(),
    }
}

/// This process's open-file room as text (`FdRoom`: WIRESPEED_NSTREAMS, the hard open-file
/// limit, descriptors held), for the store: every rank passes all of them to `Group`, which
/// decides the stream count from them alike on every rank. `knobs` as the group's.
#[pyfunction]
#[pyo3(signature = (knobs=None))]
fn fd_room(knobs: Option<HashMap<String, String>>) -> PyResult<String> {
    let knobs = knobs.unwrap_or_default();
    let net = wirespeed_core::net::config(&wirespeed_core::knobs_over_env(&knobs));
    Ok(FdRoom::here(&net).map_err(to_py)?.to_text())
}

/// 16 random bytes from the kernel, for a job token.
#[pyfunction]
fn random_token(py: Python<'_>) -> PyResult<PyObject> {
    let t = wirespeed_core::random_token().map_err(to_py)?;
    Ok(pyo3::types::PyBytes::new_bound(py, &t).into())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(core_version, m)?)?;
    m.add_function(wrap_pyfunction!(random_token, m)?)?;
    m.add_function(wrap_pyfunction!(host_id, m)?)?;
    m.add_function(wrap_pyfunction!(fd_room, m)?)?;
    m.add_class::<Group>()?;
    m.add("WirespeedError", py.get_type_bound::<WirespeedError>())?;
    m.add("PeerDiedError", py.get_type_bound::<PeerDiedError>())?;
    m.add("PeerAbortedError", py.get_type_bound::<PeerAbortedError>())?;
    m.add("CollectiveTimeout", py.get_type_bound::<CollectiveTimeout>())?;
    m.add("MismatchError", py.get_type_bound::<MismatchError>())?;
    m.add("UnsupportedError", py.get_type_bound::<UnsupportedError>())?;
    m.add("StrangerError", py.get_type_bound::<StrangerError>())?;
    m.add("BrokenGroupError", py.get_type_bound::<BrokenGroupError>())?;
    Ok(())
}
