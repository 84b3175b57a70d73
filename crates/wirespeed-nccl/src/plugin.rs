//! The one implementation behind every API version: NCCL's calls in Rust terms, over the core's
//! multi-stream TCP engine (`wirespeed_core::net`). The per-version `extern "C"` tables
//! in `ffi` only convert arguments and map errors.
//!
//! Objects NCCL holds as `void*`: a `ListenComm` (one listening socket per `listen`, with a random
//! key its dialer must present), a `Comm` (a send or receive end: one engine connection of
//! several streams), and a `Req` (one posted isend or irecv, freed when `test` reports it done).
//! A comm admits NCCL_NET_MAX_REQUESTS requests at once; beyond that isend/irecv hand back a NULL
//! request, which NCCL takes as "try again". Nothing is shared between comms but the engine's
//! I/O threads, so there is no lock on the data path beyond the engine's per-stream ones.
use crate::abi::*;
use crate::config::{find_devices, streams_for, Concurrency, Device, PluginConfig};
use crate::handle::{random_key, set_stage, stage, Handle};
use crate::log;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use wirespeed_core::net::{Conn, Dialer, Listener, Reactor, Report, Request};
use wirespeed_core::Error as CoreError;

/// A failure with the NCCL code it maps to; the message is logged at WARN by the entry point.
#[derive(Debug)]
pub struct PluginError {
    pub code: NcclResult,
    pub msg: String,
}

pub type Result<T> = std::result::Result<T, PluginError>;

pub fn usage(msg: impl Into<String>) -> PluginError {
    PluginError { code: NCCL_INVALID_USAGE, msg: msg.into() }
}

pub fn internal(msg: impl Into<String>) -> PluginError {
    PluginError { code: NCCL_INTERNAL_ERROR, msg: msg.into() }
}

/// The engine's errors in NCCL's terms: a lost or refusing peer is a remote error, a message that
/// does not fit what was posted is a usage error (NCCL's advice for size mismatches), a system
/// call failure a system error.
fn from_core(e: CoreError, what: &str) -> PluginError {
    let code = match &e {
        CoreError::PeerDied { .. } | CoreError::PeerAborted { .. } | CoreError::PeerLost(_) | CoreError::Stranger(_) | CoreError::Broken(_) => NCCL_REMOTE_ERROR,
        CoreError::Mismatch(_) | CoreError::Unsupported(_) => NCCL_INVALID_USAGE,
        CoreError::Timeout { .. } | CoreError::Os { .. } => NCCL_SYSTEM_ERROR,
    };
    PluginError { code, msg: format!("{what}: {e}") }
}

struct Global {
    cfg: PluginConfig,
    devices: Vec<Device>,
    reactor: Arc<Reactor>,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();
/// Serialises only the first initialisation (never taken on the data path).
static INIT: Mutex<()> = Mutex::new(());

fn global() -> Result<&'static Global> {
    GLOBAL.get().ok_or_else(|| internal("the plugin was used before init"))
}

/// Read the knobs, find the devices and start the I/O threads, once per process; later calls
/// (one per communicator from v11 on) only refresh the logger.
pub fn init(logger: Logger) -> Result<()> {
    log::set_logger(logger);
    if GLOBAL.get().is_some() {
        return Ok(());
    }
    let _once = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if GLOBAL.get().is_some() {
        return Ok(());
    }
    let cfg = PluginConfig::from_env().map_err(usage)?;
    let devices = find_devices(&cfg).map_err(usage)?;
    let reactor = Reactor::new(&cfg.net).map_err(|e| from_core(e, "starting the I/O threads"))?;
    log::info(NCCL_INIT | NCCL_ENV, &format!("wirespeed-net {} ready: {}", env!("CARGO_PKG_VERSION"), cfg.describe(&devices)));
    let _ = GLOBAL.set(Global { cfg, devices, reactor });
    Ok(())
}

pub fn device_count() -> Result<usize> {
    Ok(global()?.devices.len())
}

/// What getProperties reports, independent of the struct version.
pub struct Props {
    pub name: *mut std::ffi::c_char,
    pub pci_path: *mut std::ffi::c_char,
    pub guid: u64,
    pub speed: i32,
    pub dev: i32,
}

pub const MAX_COMMS: i32 = 65536;
/// One receive per irecv: each NCCL send lands in its own request.
pub const MAX_RECVS: i32 = 1;

pub fn properties(dev: i32) -> Result<Props> {
    let d = device(dev)?;
    Ok(Props {
        name: d.name.as_ptr() as *mut _,
        pci_path: d.pci_path.as_ref().map_or(std::ptr::null_mut(), |p| p.as_ptr() as *mut _),
        guid: dev as u64,
        speed: d.speed_mbps,
        dev,
    })
}

fn device(dev: i32) -> Result<&'static Device> {
    let g = global()?;
    usize::try_from(dev).ok().and_then(|i| g.devices.get(i)).ok_or_else(|| internal(format!("device {dev} does not exist (there are {})", g.devices.len())))
}

/// The listening end of one future connection.
pub struct ListenComm {
    listener: Listener,
    key: [u8; 32],
}

pub fn listen(dev: i32, handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) -> Result<Box<ListenComm>> {
    let g = global()?;
    let d = device(dev)?;
    let key = random_key().map_err(internal)?;
    let bind = match d.addr {
        IpAddr::V4(_) => SocketAddr::new(d.addr, 0),
        IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, 0, 0, d.scope_id)),
    };
    let expected = key;
    let vet = Box::new(move |k: &[u8; 32]| if *k == expected { Ok(()) } else { Err("its key is not this listener's (a stray or late connection)".into()) });
    let label = format!("listener on {}", d.name.to_string_lossy());
    // Refusals go through NCCL's logger as WARN, where NCCL users look (NCCL_DEBUG=WARN).
    let report: Report = Box::new(|line: &str| log::warn(line));
    let listener = Listener::bind_vetted(&g.reactor, &g.cfg.net, bind, vet, label, Some(report)).map_err(|e| from_core(e, "listen"))?;
    let nstreams = u16::try_from(g.cfg.net.nstreams).map_err(|_| usage("WIRESPEED_NSTREAMS is too large"))?;
    Handle { addr: listener.local_addr(), nstreams, key }.encode(handle);
    Ok(Box::new(ListenComm { listener, key }))
}

/// One communicator's context (API v11+: `init` returns it, `finalize` frees it). It holds NCCL's
/// latest `setNetAttr` hint, which the next `connect` of the communicator reads.
pub struct Ctx {
    pub comm_id: u64,
    hint: Mutex<Option<NetAttr>>,
    /// The last (hint, streams) logged at INFO: a line only when the choice changes.
    logged: Mutex<Option<(Concurrency, usize)>>,
}

impl Ctx {
    pub fn new(comm_id: u64) -> Ctx {
        Ctx { comm_id, hint: Mutex::new(None), logged: Mutex::new(None) }
    }
}

/// NCCL's hint (setNetAttr), kept for the communicator's next `connect`.
///
/// NCCL (transport/net.cc) calls it on its proxy thread with the communicator's context: before
/// each `connect` and `accept`, with the peers (up to min(nRanks, 4) for collectives; more for
/// send/recv) and flows per peer (the channels) the communicator may drive at once; and before an
/// operation's first isend/irecv when that operation's exact counts differ from the last ones.
/// Only `connect` uses it (the connecting side chooses the streams: `streams_for`); the receive
/// side's half and the op/algo/proto masks are kept for the log only. NCCL ignores the result.
pub fn set_net_attr(ctx: &Ctx, attr: NetAttr) {
    *ctx.hint.lock().unwrap_or_else(|p| p.into_inner()) = Some(attr);
}

fn sending(a: &NetAttr) -> Concurrency {
    Concurrency { peers: a.sendCommAttr.maxConcurrentPeers, flows: a.sendCommAttr.maxFlowsPerPeer }
}

fn range(min: i32, max: i32) -> String {
    let v = |x: i32| if x < 0 { "?".to_string() } else { x.to_string() };
    if min == max {
        v(max)
    } else {
        format!("{}-{}", v(min), v(max))
    }
}

fn mask(m: u32) -> String {
    if m == NCCL_NET_ATTR_UNDEF as u32 {
        "*".into()
    } else {
        format!("{m:#x}")
    }
}

/// NCCL's hint in words, as NCCL's own TRACE line puts it (peers and flows as min-max).
pub fn describe_hint(a: &NetAttr) -> String {
    let (s, r) = (&a.sendCommAttr, &a.recvCommAttr);
    format!(
        "send {} peers x {} flows, recv {} peers x {} flows, op {} algo {} proto {}",
        range(s.minConcurrentPeers, s.maxConcurrentPeers),
        range(s.minFlowsPerPeer, s.maxFlowsPerPeer),
        range(r.minConcurrentPeers, r.maxConcurrentPeers),
        range(r.minFlowsPerPeer, r.maxFlowsPerPeer),
        mask(a.op),
        mask(a.algo),
        mask(a.proto)
    )
}

/// The streams a connection to a listener announcing `base` opens: `streams_for` over the
/// communicator's hint, logged at INFO when the choice differs from the communicator's last.
fn choose_streams(g: &Global, ctx: Option<&Ctx>, base: usize) -> usize {
    let Some(ctx) = ctx else { return base };
    let Some(attr) = *ctx.hint.lock().unwrap_or_else(|p| p.into_inner()) else { return base };
    let hint = sending(&attr);
    let n = streams_for(base, g.cfg.nstreams_set, Some(hint));
    let mut logged = ctx.logged.lock().unwrap_or_else(|p| p.into_inner());
    if *logged != Some((hint, n)) {
        *logged = Some((hint, n));
        let why = if g.cfg.nstreams_set {
            format!("WIRESPEED_NSTREAMS={base} is set, so the hint changes nothing")
        } else {
            format!("the listener's {base} shared among up to {} connections to one peer at once", hint.flows.max(1))
        };
        log::info(NCCL_INIT, &format!("communicator {:#x}: NCCL's hint: {}: {n} streams per connection ({why})", ctx.comm_id, describe_hint(&attr)));
    }
    n
}

/// A send or receive end. Both are the same engine connection type; NCCL uses each one way.
pub struct Comm {
    conn: Conn,
    inflight: Arc<AtomicUsize>,
}

/// A posted isend or irecv.
pub struct Req {
    request: Request,
    inflight: Arc<AtomicUsize>,
}

impl Drop for Req {
    fn drop(&mut self) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Advance the connection whose dialing state lives in `handle` (see handle.rs); `None` until every
/// stream is connected and greeted. `ctx` (API v11+) holds NCCL's hint, which may lower the stream
/// count the listener announced (`choose_streams`).
///
/// Not marked unsafe, but the handle's stage must be 0 or a value this function stored there
/// (NCCL hands the handle back unchanged between calls: its contract, ffi.rs).
pub fn connect(dev: i32, handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE], ctx: Option<&Ctx>) -> Result<Option<Box<Comm>>> {
    let g = global()?;
    device(dev)?;
    let mut dialer = match stage(handle) {
        0 => {
            let h = Handle::decode(handle).map_err(usage)?;
            let key = h.key;
            let n = choose_streams(g, ctx, h.nstreams as usize);
            let d = Dialer::start(&g.reactor, &g.cfg.net, h.addr, key, n).map_err(|e| from_core(e, &format!("connecting to {}", h.addr)))?;
            Box::new(d)
        }
        // SAFETY: a non-zero stage is the Box<Dialer> an earlier call on this same handle leaked
        // into it (NCCL returns the handle unchanged: see above); it is taken back here and
        // either stored again or dropped, and the stage is reset first.
        p => unsafe { Box::from_raw(p as usize as *mut Dialer) },
    };
    set_stage(handle, 0);
    match dialer.poll() {
        Ok(Some(conn)) => Ok(Some(Box::new(Comm { conn, inflight: Arc::new(AtomicUsize::new(0)) }))),
        Ok(None) => {
            set_stage(handle, Box::into_raw(dialer) as usize as u64);
            Ok(None)
        }
        Err(e) => Err(from_core(e, "connect")),
    }
}

pub fn accept(l: &ListenComm) -> Result<Option<Box<Comm>>> {
    match l.listener.poll_accept().map_err(|e| from_core(e, "accept"))? {
        None => Ok(None),
        Some((key, conn)) => {
            if key != l.key {
                return Err(internal("accepted a connection with a foreign key"));
            }
            Ok(Some(Box::new(Comm { conn, inflight: Arc::new(AtomicUsize::new(0)) })))
        }
    }
}

/// NCCL may pass NULL for an empty buffer; the engine makes slices of its buffers, and a slice may
/// not start at NULL even when empty, so an empty buffer gets a dangling (aligned, non-null) one.
fn non_null(p: *mut u8) -> *mut u8 {
    if p.is_null() {
        std::ptr::NonNull::<u8>::dangling().as_ptr()
    } else {
        p
    }
}

/// Reserve a request slot, or None when the comm already has the maximum in flight.
fn reserve(c: &Comm) -> bool {
    c.inflight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < NCCL_NET_MAX_REQUESTS).then_some(n + 1))
        .is_ok()
}

/// Post a send of `size` bytes at `data`.
///
/// # Safety
/// `data..data+size` stays valid and unchanged until `test` reports the request done or the comm
/// is closed (NCCL's contract for isend).
pub unsafe fn isend(c: &Comm, data: *const u8, size: usize, tag: i32) -> Result<Option<Box<Req>>> {
    if size > 0 && data.is_null() {
        return Err(internal("isend of a NULL buffer"));
    }
    if !reserve(c) {
        return Ok(None);
    }
    let inflight = c.inflight.clone();
    // SAFETY: this fn's contract is Conn::isend's for `data..data+size`: `test` reporting the
    // request done is its completion, and closing the comm closes the connection. `non_null`
    // only replaces the NULL of an empty message.
    match unsafe { c.conn.isend(non_null(data as *mut u8), size, tag as u32 as u64) } {
        Ok(request) => Ok(Some(Box::new(Req { request, inflight }))),
        Err(e) => {
            inflight.fetch_sub(1, Ordering::AcqRel);
            Err(from_core(e, "isend"))
        }
    }
}

/// Post a receive of at most `cap` bytes into `data`.
///
/// # Safety
/// `data..data+cap` stays valid and untouched by others until `test` reports the request done or
/// the comm is closed (NCCL's contract for irecv).
pub unsafe fn irecv(c: &Comm, data: *mut u8, cap: usize, tag: i32) -> Result<Option<Box<Req>>> {
    if cap > 0 && data.is_null() {
        return Err(internal("irecv into a NULL buffer"));
    }
    if !reserve(c) {
        return Ok(None);
    }
    let inflight = c.inflight.clone();
    // SAFETY: this fn's contract is Conn::irecv's for `data..data+cap`, as for isend.
    match unsafe { c.conn.irecv(non_null(data), cap, tag as u32 as u64) } {
        Ok(request) => Ok(Some(Box::new(Req { request, inflight }))),
        Err(e) => {
            inflight.fetch_sub(1, Ordering::AcqRel);
            Err(from_core(e, "irecv"))
        }
    }
}

/// `Some(bytes)` once the request is complete; the engine's error (a lost peer, a message larger
/// than the posted buffer, a tag that does not match) otherwise.
pub fn test(r: &Req) -> Result<Option<usize>> {
    r.request.test().map_err(|e| from_core(e, "test"))
}

/// Close a comm: pending requests fail, and when this returns the engine touches none of their
/// buffers again. The requests themselves stay valid objects (NCCL may still own pointers to
/// them); each is freed by its final `test`, or never if NCCL drops it.
pub fn close(c: Box<Comm>) {
    c.conn.close();
}

/// A registration handle for host memory: nothing to register with a TCP socket, but NCCL wants a
/// non-NULL value back.
pub fn reg_mr(ptr_type: i32) -> Result<*mut std::ffi::c_void> {
    if ptr_type != NCCL_PTR_HOST {
        return Err(internal(format!("memory of type {ptr_type} cannot be registered: wirespeed-net sends host memory only (ptrSupport = NCCL_PTR_HOST)")));
    }
    static TOKEN: u8 = 0;
    Ok(&TOKEN as *const u8 as *mut std::ffi::c_void)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ncclNetAttr_t as NCCL's C code lays it out: four int32 per direction, then three uint32.
    fn from_c_bytes(words: [u32; 11]) -> NetAttr {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(bytes.len(), std::mem::size_of::<NetAttr>());
        // SAFETY: 44 initialised bytes, read unaligned into a struct of plain integers (any bit
        // pattern is valid).
        unsafe { (bytes.as_ptr() as *const NetAttr).read_unaligned() }
    }

    #[test]
    fn the_attributes_read_in_the_headers_field_order() {
        let a = from_c_bytes([4, 1, 2, 1, 8, 1, 3, 1, 0x1f, u32::MAX, 0b100]);
        assert_eq!(a.sendCommAttr, NetCommAttr { maxConcurrentPeers: 4, minConcurrentPeers: 1, maxFlowsPerPeer: 2, minFlowsPerPeer: 1 });
        assert_eq!(a.recvCommAttr, NetCommAttr { maxConcurrentPeers: 8, minConcurrentPeers: 1, maxFlowsPerPeer: 3, minFlowsPerPeer: 1 });
        assert_eq!((a.op, a.algo, a.proto), (0x1f, u32::MAX, 4));
        assert_eq!(sending(&a), Concurrency { peers: 4, flows: 2 });
        assert_eq!(describe_hint(&a), "send 1-4 peers x 1-2 flows, recv 1-8 peers x 1-3 flows, op 0x1f algo * proto 0x4");
    }

    #[test]
    fn a_context_keeps_the_latest_hint() {
        let ctx = Ctx::new(7);
        assert!(ctx.hint.lock().unwrap().is_none());
        let undef = NetCommAttr { maxConcurrentPeers: -1, minConcurrentPeers: -1, maxFlowsPerPeer: -1, minFlowsPerPeer: -1 };
        let mut a = NetAttr { sendCommAttr: undef, recvCommAttr: undef, op: u32::MAX, algo: u32::MAX, proto: u32::MAX };
        set_net_attr(&ctx, a);
        a.sendCommAttr.maxConcurrentPeers = 2;
        set_net_attr(&ctx, a);
        assert_eq!(ctx.hint.lock().unwrap().map(|h| sending(&h)), Some(Concurrency { peers: 2, flows: -1 }));
        assert_eq!(describe_hint(&a), "send ?-2 peers x ? flows, recv ? peers x ? flows, op * algo * proto *");
    }
}
