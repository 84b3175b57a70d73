//! The exported `ncclNetPlugin_v8` .. `_v12` tables: thin adapters from each version's C
//! signatures to `plugin`. Every entry point runs under `guard`, which turns an error into its
//! NCCL code (logged at WARN through NCCL's logger) and a panic into ncclInternalError, so
//! nothing unwinds into NCCL.
//!
//! # Safety
//!
//! NCCL's pointer contract: the rules of its net plugin API (`net_vN.h`) under which NCCL calls
//! every `unsafe extern "C" fn` here, and which the SAFETY lines below call "NCCL's contract":
//! - an out-parameter (`ndev`, `props`, `ctx`, `listenComm`, `sendComm`, `recvComm`, `mhandle`,
//!   `request`, `done`, `size`) points to writable storage of its type, aligned, for the call;
//!   NULL is refused (`put`), or skipped where the API makes it optional (`test`'s `size`);
//! - `netAttr` (setNetAttr) points to an ncclNetAttr_t (abi::NetAttr), readable for the call;
//! - `handle` points to NCCL_NET_HANDLE_MAXSIZE bytes for the call; between the `connect` calls
//!   of one connection NCCL keeps them and hands them back unchanged (the plugin keeps its
//!   dialing state there);
//! - a comm, request or context passed in is one this plugin returned, of the kind the entry
//!   takes (a listen comm to accept/closeListen, a connection to isend/irecv/close, a request to
//!   test, a context to setNetAttr, listen, connect and finalize), not yet closed or freed; each
//!   is closed or finalized once, and a request is not tested again after `test` reported it done
//!   or failed;
//! - isend's `data` stays valid and unchanged for `size` bytes, and irecv's `data[0]` valid for
//!   `sizes[0]` bytes and untouched by NCCL, until `test` reports the request done or its comm is
//!   closed; irecv's `data`, `sizes` and `tags` are arrays of `n` entries;
//! - the logger given to init is a printf-like ncclDebugLogger_t that stays callable.
use crate::abi::*;
use crate::log;
use crate::plugin::{self, internal, Comm, Ctx, ListenComm, PluginError, Props, Req};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const NAME: &std::ffi::CStr = c"wirespeed";

fn guard(what: &str, f: impl FnOnce() -> Result<(), PluginError>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => {
            log::warn(&e.msg);
            e.code
        }
        Err(panic) => {
            let why = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            log::warn(&format!("{what}: internal error (a bug in wirespeed-net: {why})"));
            NCCL_INTERNAL_ERROR
        }
    }
}

/// `*out = v` for a caller's out-parameter, refusing NULL.
///
/// # Safety
/// `out` is NULL or valid for an aligned write of a `T`: an out-parameter under NCCL's contract.
unsafe fn put<T>(out: *mut T, v: T, what: &str) -> Result<(), PluginError> {
    if out.is_null() {
        return Err(internal(format!("{what}: NULL output pointer")));
    }
    // SAFETY: non-NULL (checked above), so by this fn's contract writable and aligned for `T`.
    unsafe { out.write(v) };
    Ok(())
}

/// `p` as the plugin object it was handed out as, refusing NULL.
///
/// # Safety
/// `p` is NULL or a `T` this plugin boxed and returned, not freed for `'a`: a comm or request
/// under NCCL's contract.
unsafe fn obj<'a, T>(p: *mut c_void, what: &str) -> Result<&'a T, PluginError> {
    if p.is_null() {
        return Err(internal(format!("{what}: NULL comm")));
    }
    // SAFETY: non-NULL, so by this fn's contract a live `T`; only shared references to plugin
    // objects are made while NCCL holds them.
    Ok(unsafe { &*(p as *const T) })
}

/// NCCL's connection handle as bytes, refusing NULL.
///
/// # Safety
/// `h` is NULL or points to NCCL_NET_HANDLE_MAXSIZE bytes that nothing else touches for `'a`
/// (NCCL's contract for `handle`).
unsafe fn handle_bytes<'a>(h: *mut c_void) -> Result<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE], PluginError> {
    if h.is_null() {
        return Err(internal("NULL connection handle"));
    }
    // SAFETY: non-NULL, so by this fn's contract NCCL_NET_HANDLE_MAXSIZE bytes that are ours for
    // `'a`; a byte array needs no alignment.
    Ok(unsafe { &mut *(h as *mut [u8; NCCL_NET_HANDLE_MAXSIZE]) })
}

// ---------------------------------------------------------------------------------------------
// Entry points every version shares

// SAFETY: `init_v8` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn init_v8(logger: Logger) -> NcclResult {
    guard("init", || plugin::init(logger))
}

// SAFETY: `init_v10` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn init_v10(logger: Logger, _prof: ProfilerCallback) -> NcclResult {
    guard("init", || plugin::init(logger))
}

// SAFETY: `init_v11` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn init_v11(ctx: *mut *mut c_void, comm_id: u64, _config: *mut CommConfig, logger: Logger, _prof: ProfilerCallback) -> NcclResult {
    guard("init", || {
        // NCCL calls finalize on this context even when init fails: leave it NULL until success.
        // SAFETY: NCCL's contract: `ctx` is an out-parameter.
        unsafe { put(ctx, std::ptr::null_mut(), "init")? };
        plugin::init(logger)?;
        // SAFETY: as above; the box is freed by `finalize`.
        unsafe { put(ctx, Box::into_raw(Box::new(Ctx::new(comm_id))) as *mut c_void, "init") }
    })
}

// SAFETY: `finalize` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    guard("finalize", || {
        if !ctx.is_null() {
            // SAFETY: NCCL's contract: a context init_v11 boxed and returned, finalized once.
            let c = unsafe { Box::from_raw(ctx as *mut Ctx) };
            log::info(NCCL_INIT, &format!("finalized the context of communicator {:#x}", c.comm_id));
        }
        Ok(())
    })
}

/// NCCL's hint of how many peers and flows per peer the communicator drives at once (v11+; see
/// plugin::set_net_attr): kept in the context for its next `connect`.
// SAFETY: `set_net_attr` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn set_net_attr(ctx: *mut c_void, attr: *mut NetAttr) -> NcclResult {
    guard("setNetAttr", || {
        if attr.is_null() {
            return Err(internal("setNetAttr: NULL attributes"));
        }
        // SAFETY: NCCL's contract: a context init_v11 returned, not finalized (NULL refused).
        let c: &Ctx = unsafe { obj(ctx, "setNetAttr")? };
        // SAFETY: NCCL's contract: `attr` points to an ncclNetAttr_t, readable for the call
        // (NULL checked above); it holds only integers, so any bits are a valid NetAttr.
        let a = unsafe { attr.read() };
        plugin::set_net_attr(c, a);
        Ok(())
    })
}

// SAFETY: `devices` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    guard("devices", || {
        let n = plugin::device_count()?;
        // SAFETY: NCCL's contract: `ndev` is an out-parameter.
        unsafe { put(ndev, n as c_int, "devices") }
    })
}

/// NCCL_NET_ID_UNDEF: no rail or plane information.
const NET_ID_UNDEF: i16 = -1;

/// A version's properties struct, filled from the plugin's version-free `Props`.
trait FromProps {
    fn from_props(p: &Props) -> Self;
}

/// `FromProps` for `$ty`: the fields every version has, then (after `v9`) those every version
/// from v9 on has, then the version's own. (`|p|` names the `Props` for the fields that read it.)
macro_rules! from_props {
    (v9 $ty:ident { $($field:ident: $val:expr,)* }) => {
        from_props!(|p| $ty {
            forceFlush: 0,
            vProps: one_device(p.dev),
            maxP2pBytes: NCCL_MAX_NET_SIZE_BYTES,
            maxCollBytes: NCCL_MAX_NET_SIZE_BYTES,
            $($field: $val,)*
        });
    };
    ($ty:ident { $($field:ident: $val:expr,)* }) => {
        from_props!(|p| $ty { $($field: $val,)* });
    };
    (|$p:ident| $ty:ident { $($field:ident: $val:expr,)* }) => {
        impl FromProps for $ty {
            fn from_props($p: &Props) -> Self {
                $ty {
                    name: $p.name,
                    pciPath: $p.pci_path,
                    guid: $p.guid,
                    ptrSupport: NCCL_PTR_HOST,
                    regIsGlobal: 0,
                    speed: $p.speed,
                    port: 0,
                    latency: 0.0,
                    maxComms: plugin::MAX_COMMS,
                    maxRecvs: plugin::MAX_RECVS,
                    netDeviceType: NCCL_NET_DEVICE_HOST,
                    netDeviceVersion: NCCL_NET_DEVICE_INVALID_VERSION,
                    $($field: $val,)*
                }
            }
        }
    };
}

/// The virtual device of one NIC, `dev` (the plugin fuses none).
fn one_device<const N: usize>(dev: c_int) -> VDeviceProps<N> {
    let mut devs = [0; N];
    devs[0] = dev;
    VDeviceProps { ndevs: 1, devs }
}

from_props!(PropertiesV8 {});
from_props!(v9 PropertiesV9 {});
from_props!(v9 PropertiesV11 { maxMultiRequestSize: 1, });
from_props!(v9 PropertiesV12 { maxMultiRequestSize: 1, railId: NET_ID_UNDEF, planeId: NET_ID_UNDEF, });

/// getProperties of every version, `T` its properties struct.
// SAFETY: `get_properties` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn get_properties<T: FromProps>(dev: c_int, out: *mut T) -> NcclResult {
    guard("getProperties", || {
        let p = plugin::properties(dev)?;
        // SAFETY: NCCL's contract: `out` (getProperties' `props`) is an out-parameter.
        unsafe { put(out, T::from_props(&p), "getProperties") }
    })
}

// SAFETY: `listen` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn listen(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    guard("listen", || {
        // SAFETY: NCCL's contract: `handle` is NCCL_NET_HANDLE_MAXSIZE bytes for the call.
        let h = unsafe { handle_bytes(handle)? };
        let l = plugin::listen(dev, h)?;
        // SAFETY: NCCL's contract: `listen_comm` is an out-parameter; NCCL hands the box back to
        // accept and closeListen.
        unsafe { put(listen_comm, Box::into_raw(l) as *mut c_void, "listen") }
    })
}

// SAFETY: `listen_v11` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn listen_v11(_ctx: *mut c_void, dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: the same arguments as `listen`'s, under the same contract.
    unsafe { listen(dev, handle, listen_comm) }
}

/// The device-offload handle (`sendDevComm`/`recvDevComm`) is left untouched: NCCL only asks for
/// one when the properties announce a device type other than NCCL_NET_DEVICE_HOST.
// SAFETY: `connect` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn connect(dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void, dev_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: the same arguments, under the same contract, and no context (API v8..v10).
    unsafe { connect_with(std::ptr::null_mut(), dev, handle, send_comm, dev_comm) }
}

/// connect of every version; `ctx` is v11+'s context or NULL (none: no hint).
///
/// # Safety
/// NCCL's contract for connect's `handle` and `send_comm`, and for `ctx` when it is not NULL.
unsafe fn connect_with(ctx: *mut c_void, dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void, _dev_comm: *mut *mut c_void) -> NcclResult {
    guard("connect", || {
        // SAFETY: this fn's contract: a non-NULL `ctx` is a context init_v11 returned, not
        // finalized.
        let ctx: Option<&Ctx> = if ctx.is_null() { None } else { Some(unsafe { obj(ctx, "connect")? }) };
        // SAFETY: NCCL's contract: `send_comm` is an out-parameter (NULL until connected).
        unsafe { put(send_comm, std::ptr::null_mut(), "connect")? };
        // SAFETY: NCCL's contract: `handle` is this connection's handle bytes, kept by NCCL
        // between calls, where plugin::connect keeps its dialing state.
        let h = unsafe { handle_bytes(handle)? };
        match plugin::connect(dev, h, ctx)? {
            None => Ok(()),
            // SAFETY: as above, `send_comm`; NCCL hands the box back to isend and closeSend.
            Some(c) => unsafe { put(send_comm, Box::into_raw(c) as *mut c_void, "connect") },
        }
    })
}

// SAFETY: `connect_v10` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn connect_v10(dev: c_int, _config: *mut CommConfig, handle: *mut c_void, send_comm: *mut *mut c_void, dev_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: the same arguments as `connect`'s, under the same contract.
    unsafe { connect(dev, handle, send_comm, dev_comm) }
}

// SAFETY: `connect_v11` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn connect_v11(ctx: *mut c_void, dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void, dev_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: this entry's own arguments, under NCCL's contract, which is connect_with's.
    unsafe { connect_with(ctx, dev, handle, send_comm, dev_comm) }
}

// SAFETY: `accept` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn accept(listen_comm: *mut c_void, recv_comm: *mut *mut c_void, _dev_comm: *mut *mut c_void) -> NcclResult {
    guard("accept", || {
        // SAFETY: NCCL's contract: `recv_comm` is an out-parameter (NULL until accepted).
        unsafe { put(recv_comm, std::ptr::null_mut(), "accept")? };
        // SAFETY: NCCL's contract: `listen_comm` is a ListenComm `listen` returned, not closed.
        let l: &ListenComm = unsafe { obj(listen_comm, "accept")? };
        match plugin::accept(l)? {
            None => Ok(()),
            // SAFETY: as above, `recv_comm`; NCCL hands the box back to irecv and closeRecv.
            Some(c) => unsafe { put(recv_comm, Box::into_raw(c) as *mut c_void, "accept") },
        }
    })
}

// SAFETY: `reg_mr` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn reg_mr(_comm: *mut c_void, _data: *mut c_void, _size: usize, ptr_type: c_int, mhandle: *mut *mut c_void) -> NcclResult {
    guard("regMr", || {
        let h = plugin::reg_mr(ptr_type)?;
        // SAFETY: NCCL's contract: `mhandle` is an out-parameter.
        unsafe { put(mhandle, h, "regMr") }
    })
}

// SAFETY: `reg_mr_dma_buf` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn reg_mr_dma_buf(_comm: *mut c_void, _data: *mut c_void, _size: usize, _ptr_type: c_int, _offset: u64, _fd: c_int, _mhandle: *mut *mut c_void) -> NcclResult {
    guard("regMrDmaBuf", || Err(internal("regMrDmaBuf: wirespeed-net does not announce NCCL_PTR_DMABUF")))
}

// SAFETY: `dereg_mr` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn dereg_mr(_comm: *mut c_void, _mhandle: *mut c_void) -> NcclResult {
    NCCL_SUCCESS
}

/// Hand a request (or NULL: try again) to NCCL. Not marked unsafe, but `request` must be the
/// isend/irecv out-parameter (NCCL's contract): its only callers, do_isend and do_irecv, pass
/// theirs, checked non-NULL.
fn post(request: *mut *mut c_void, r: Option<Box<Req>>) -> Result<(), PluginError> {
    let p = r.map_or(std::ptr::null_mut(), |b| Box::into_raw(b) as *mut c_void);
    // SAFETY: `request` is isend's or irecv's out-parameter (see above), as `put` requires.
    unsafe { put(request, p, "isend/irecv") }
}

fn size_of_int(size: c_int, what: &str) -> Result<usize, PluginError> {
    usize::try_from(size).map_err(|_| internal(format!("{what}: negative size {size}")))
}

/// isend of every version, `size` already a usize.
///
/// # Safety
/// NCCL's contract for isend's `send_comm`, `data` and `size`, and `request`.
unsafe fn do_isend(send_comm: *mut c_void, data: *mut c_void, size: usize, tag: c_int, request: *mut *mut c_void) -> NcclResult {
    guard("isend", || {
        if request.is_null() {
            return Err(internal("isend: NULL request pointer"));
        }
        // SAFETY: this fn's contract: `send_comm` is a Comm `connect` returned, not closed.
        let c: &Comm = unsafe { obj(send_comm, "isend")? };
        // SAFETY: this fn's contract: `data..data+size` stays valid and unchanged until `test`
        // reports the request done or the comm is closed, which is plugin::isend's.
        let r = unsafe { plugin::isend(c, data as *const u8, size, tag)? };
        post(request, r)
    })
}

// SAFETY: `isend_v8` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn isend_v8(send_comm: *mut c_void, data: *mut c_void, size: c_int, tag: c_int, _mh: *mut c_void, request: *mut *mut c_void) -> NcclResult {
    match size_of_int(size, "isend") {
        // SAFETY: this entry's own arguments, under NCCL's contract, which is do_isend's.
        Ok(n) => unsafe { do_isend(send_comm, data, n, tag, request) },
        Err(e) => guard("isend", || Err(e)),
    }
}

// SAFETY: `isend_v9` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn isend_v9(send_comm: *mut c_void, data: *mut c_void, size: usize, tag: c_int, _mh: *mut c_void, request: *mut *mut c_void) -> NcclResult {
    // SAFETY: this entry's own arguments, under NCCL's contract, which is do_isend's.
    unsafe { do_isend(send_comm, data, size, tag, request) }
}

// SAFETY: `isend_v10` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn isend_v10(send_comm: *mut c_void, data: *mut c_void, size: usize, tag: c_int, _mh: *mut c_void, _ph: *mut c_void, request: *mut *mut c_void) -> NcclResult {
    // SAFETY: this entry's own arguments, under NCCL's contract, which is do_isend's.
    unsafe { do_isend(send_comm, data, size, tag, request) }
}

/// One receive (maxRecvs = 1). For v9+ NCCL may have put NCCL_NET_OPTIONAL_RECV_COMPLETION in
/// `*request`; the receive is completed normally anyway and `*request` overwritten.
///
/// # Safety
/// NCCL's contract for irecv's `recv_comm`, `data`, `tags` and `request`; `size` reads `sizes[0]`
/// and is called only once n == 1 is checked.
unsafe fn do_irecv(recv_comm: *mut c_void, n: c_int, data: *mut *mut c_void, size: impl FnOnce() -> Result<usize, PluginError>, tags: *mut c_int, request: *mut *mut c_void) -> NcclResult {
    guard("irecv", || {
        if n != 1 {
            return Err(internal(format!("irecv of {n} buffers: wirespeed-net announces maxRecvs = 1")));
        }
        if data.is_null() || tags.is_null() || request.is_null() {
            return Err(internal("irecv: NULL buffer, tag or request pointer"));
        }
        // SAFETY: this fn's contract: `recv_comm` is a Comm `accept` returned, not closed.
        let c: &Comm = unsafe { obj(recv_comm, "irecv")? };
        let cap = size()?;
        // SAFETY: this fn's contract: `data` and `tags` are arrays of n = 1 entries (checked
        // above, as is NULL).
        let (buf, tag) = unsafe { (*data, *tags) };
        // SAFETY: this fn's contract: `buf` stays valid for `cap` bytes, and NCCL leaves it alone,
        // until `test` reports the request done or the comm is closed: plugin::irecv's contract.
        let r = unsafe { plugin::irecv(c, buf as *mut u8, cap, tag)? };
        post(request, r)
    })
}

// SAFETY: `irecv_v8` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn irecv_v8(recv_comm: *mut c_void, n: c_int, data: *mut *mut c_void, sizes: *mut c_int, tags: *mut c_int, _mh: *mut *mut c_void, request: *mut *mut c_void) -> NcclResult {
    // SAFETY: for the read of `*sizes`, NCCL's contract makes `sizes` an array of n entries;
    // do_irecv calls this only after checking n == 1, and NULL is checked here.
    let size = || if sizes.is_null() { Err(internal("irecv: NULL sizes")) } else { size_of_int(unsafe { *sizes }, "irecv") };
    // SAFETY: this entry's own arguments, under NCCL's contract, which is do_irecv's.
    unsafe { do_irecv(recv_comm, n, data, size, tags, request) }
}

// SAFETY: `irecv_v9` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn irecv_v9(recv_comm: *mut c_void, n: c_int, data: *mut *mut c_void, sizes: *mut usize, tags: *mut c_int, _mh: *mut *mut c_void, request: *mut *mut c_void) -> NcclResult {
    // SAFETY: for the read of `*sizes`, as in irecv_v8.
    let size = || if sizes.is_null() { Err(internal("irecv: NULL sizes")) } else { Ok(unsafe { *sizes }) };
    // SAFETY: this entry's own arguments, under NCCL's contract, which is do_irecv's.
    unsafe { do_irecv(recv_comm, n, data, size, tags, request) }
}

// SAFETY: `irecv_v10` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn irecv_v10(recv_comm: *mut c_void, n: c_int, data: *mut *mut c_void, sizes: *mut usize, tags: *mut c_int, mh: *mut *mut c_void, _ph: *mut *mut c_void, request: *mut *mut c_void) -> NcclResult {
    // SAFETY: the same arguments as irecv_v9's, under the same contract.
    unsafe { irecv_v9(recv_comm, n, data, sizes, tags, mh, request) }
}

/// Host memory written by a socket read is visible to the GPU without a flush: no request.
// SAFETY: `iflush` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn iflush(_recv_comm: *mut c_void, _n: c_int, _data: *mut *mut c_void, _sizes: *mut c_int, _mh: *mut *mut c_void, request: *mut *mut c_void) -> NcclResult {
    // SAFETY: NCCL's contract: `request` is an out-parameter.
    guard("iflush", || unsafe { put(request, std::ptr::null_mut(), "iflush") })
}

/// Poll a request. Once it reports done (or an error) it is freed: NCCL never tests it again.
// SAFETY: `test` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, size: *mut c_int) -> NcclResult {
    guard("test", || {
        if request.is_null() || done.is_null() {
            return Err(internal("test: NULL request or done pointer"));
        }
        // SAFETY: NCCL's contract: `request` is a Req isend or irecv returned, not yet reported
        // done or failed.
        let r: &Req = unsafe { obj(request, "test")? };
        let outcome = plugin::test(r);
        let finished = !matches!(outcome, Ok(None));
        if finished {
            // SAFETY: the Box this plugin handed out for the request; NCCL drops its pointer
            // once `done` is set or an error is returned.
            drop(unsafe { Box::from_raw(request as *mut Req) });
        }
        let bytes = outcome?;
        // SAFETY: NCCL's contract: `done` is an out-parameter, non-NULL (checked above).
        unsafe { done.write(bytes.is_some() as c_int) };
        if let (Some(n), false) = (bytes, size.is_null()) {
            // NCCL's size out-parameter is an int in every version; its steps are far smaller.
            // SAFETY: NCCL's contract: `size`, when not NULL (checked), is an out-parameter.
            unsafe { size.write(n.min(c_int::MAX as usize) as c_int) };
        }
        Ok(())
    })
}

// SAFETY: `close_comm` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn close_comm(comm: *mut c_void) -> NcclResult {
    guard("close", || {
        if !comm.is_null() {
            // SAFETY: NCCL's contract: a Comm connect or accept boxed and returned, closed once.
            drop(unsafe { Box::from_raw(comm as *mut Comm) });
        }
        Ok(())
    })
}

// SAFETY: `close_listen` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> NcclResult {
    guard("closeListen", || {
        if !listen_comm.is_null() {
            // SAFETY: NCCL's contract: a ListenComm `listen` boxed and returned, closed once.
            drop(unsafe { Box::from_raw(listen_comm as *mut ListenComm) });
        }
        Ok(())
    })
}

// SAFETY: `get_device_mr` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn get_device_mr(_comm: *mut c_void, _mhandle: *mut c_void, _out: *mut *mut c_void) -> NcclResult {
    guard("getDeviceMr", || Err(internal("getDeviceMr: wirespeed-net has no device-side networking")))
}

// SAFETY: `irecv_consumed` is called by NCCL (or the test driver) with pointers valid as NCCL's contract says (ffi.rs, `# Safety`)
unsafe extern "C" fn irecv_consumed(_recv_comm: *mut c_void, _n: c_int, _request: *mut c_void) -> NcclResult {
    guard("irecvConsumed", || Err(internal("irecvConsumed: wirespeed-net has no device-side networking")))
}

// ---------------------------------------------------------------------------------------------
// The tables NCCL dlsyms. makeVDevice (NIC fusion) is NULL, which NCCL allows.

const NAME_PTR: *const c_char = NAME.as_ptr();

/// One version's table: the entries every version shares, and the version's own (`$field`s).
macro_rules! table {
    ($ty:ident { $($field:ident: $val:expr,)* }) => {
        $ty {
            name: NAME_PTR,
            devices: Some(devices),
            accept: Some(accept),
            regMr: Some(reg_mr),
            regMrDmaBuf: Some(reg_mr_dma_buf),
            deregMr: Some(dereg_mr),
            iflush: Some(iflush),
            test: Some(test),
            closeSend: Some(close_comm),
            closeRecv: Some(close_comm),
            closeListen: Some(close_listen),
            getDeviceMr: Some(get_device_mr),
            irecvConsumed: Some(irecv_consumed),
            $($field: $val,)*
        }
    };
}

#[no_mangle]
pub static ncclNetPlugin_v8: NetV8 = table!(NetV8 {
    init: Some(init_v8),
    getProperties: Some(get_properties::<PropertiesV8>),
    listen: Some(listen),
    connect: Some(connect),
    isend: Some(isend_v8),
    irecv: Some(irecv_v8),
});

#[no_mangle]
pub static ncclNetPlugin_v9: NetV9 = table!(NetV9 {
    init: Some(init_v8),
    getProperties: Some(get_properties::<PropertiesV9>),
    listen: Some(listen),
    connect: Some(connect),
    isend: Some(isend_v9),
    irecv: Some(irecv_v9),
    makeVDevice: None,
});

#[no_mangle]
pub static ncclNetPlugin_v10: NetV10 = table!(NetV10 {
    init: Some(init_v10),
    getProperties: Some(get_properties::<PropertiesV9>),
    listen: Some(listen),
    connect: Some(connect_v10),
    isend: Some(isend_v10),
    irecv: Some(irecv_v10),
    makeVDevice: None,
});

/// The v11 table; v12 has the same layout and entry points and differs only in the properties
/// struct (`P`), so both are built here.
const fn table_v11<P: FromProps>() -> NetV11<P> {
    table!(NetV11 {
        init: Some(init_v11),
        getProperties: Some(get_properties::<P>),
        listen: Some(listen_v11),
        connect: Some(connect_v11),
        isend: Some(isend_v10),
        irecv: Some(irecv_v10),
        makeVDevice: None,
        finalize: Some(finalize),
        setNetAttr: Some(set_net_attr),
    })
}

#[no_mangle]
pub static ncclNetPlugin_v11: NetV11<PropertiesV11> = table_v11();

#[no_mangle]
pub static ncclNetPlugin_v12: NetV12 = table_v11();
