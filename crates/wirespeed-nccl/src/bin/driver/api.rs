//! The plugin seen from NCCL's side: dlopen the library, dlsym `ncclNetPlugin_vN`, and call its
//! table with each version's own argument types (int sizes in v8, per-communicator contexts in
//! v11+, ...), as NCCL's compatibility layer does. Errors are the raw ncclResult_t codes.
use nccl_net_wirespeed::abi::*;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};

extern "C" {
    /// logger.c: a C variadic function with ncclDebugLogger_t's signature.
    fn driver_log(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...);
}

pub type Ptr = *mut c_void;
pub type Rc = c_int;

enum Table {
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11<PropertiesV11>),
    V12(&'static NetV12),
}

pub struct Net {
    lib: Ptr,
    t: Table,
    pub version: u32,
    pub name: String,
    ctxs: Vec<Ptr>,
}

/// The fields the driver checks, read from whichever properties struct the version has.
#[derive(Debug)]
pub struct PropsView {
    pub name: String,
    pub pci_path: Option<String>,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub dev_type: c_int,
    /// v9+: (vProps.ndevs, vProps.devs[0], maxP2pBytes).
    pub vprops: Option<(c_int, c_int, usize)>,
}

fn rc(r: Rc) -> Result<(), Rc> {
    if r == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

fn opt(p: Ptr) -> Option<Ptr> {
    (!p.is_null()).then_some(p)
}

macro_rules! each {
    ($self:expr, $t:ident => $e:expr) => {
        match $self.t {
            Table::V8($t) => $e,
            Table::V9($t) => $e,
            Table::V10($t) => $e,
            Table::V11($t) => $e,
            Table::V12($t) => $e,
        }
    };
}

/// Call a function-pointer field that must be present.
macro_rules! f {
    ($t:ident . $field:ident) => {
        $t.$field.expect(concat!(stringify!($field), " is NULL in the plugin's table"))
    };
}

// SAFETY: callers uphold the contract stated in this function's doc comment.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Net {
    pub fn open(lib: &str, version: u32) -> Result<Net, String> {
        let path = CString::new(lib).map_err(|_| "bad library path".to_string())?;
        // SAFETY: dlopen/dlsym with valid C strings; the handle is never closed.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            let why = unsafe { cstr(libc::dlerror()) }.unwrap_or_default();
            return Err(format!("dlopen {lib}: {why}"));
        }
        let sym = CString::new(format!("ncclNetPlugin_v{version}")).unwrap();
        // SAFETY: a system call whose pointer arguments are live locals or C strings that outlive it.
        let p = unsafe { libc::dlsym(h, sym.as_ptr()) };
        if p.is_null() {
            return Err(format!("{lib} exports no {}", sym.to_string_lossy()));
        }
        // SAFETY: the symbol is the plugin's table of this version (the point of the test).
        let t = unsafe {
            match version {
                8 => Table::V8(&*(p as *const NetV8)),
                9 => Table::V9(&*(p as *const NetV9)),
                10 => Table::V10(&*(p as *const NetV10)),
                11 => Table::V11(&*(p as *const NetV11<PropertiesV11>)),
                12 => Table::V12(&*(p as *const NetV12)),
                v => return Err(format!("API version {v} is not driven (8..12)")),
            }
        };
        // `name` is the first field of every version's table.
        // SAFETY: NCCL's pointer arguments, valid for this call under its net API contract, forwarded unchanged.
        let name = unsafe { cstr(*(p as *const *const c_char)) }.unwrap_or_default();
        Ok(Net { lib: h, t, version, name, ctxs: vec![] })
    }

    /// dlclose the library, as NCCL does when its last communicator is destroyed.
    pub fn unload(self) -> Result<(), String> {
        // SAFETY: the handle from dlopen; nothing of the library is used after this.
        match unsafe { libc::dlclose(self.lib) } {
            0 => Ok(()),
            _ => Err(format!("dlclose: {}", unsafe { cstr(libc::dlerror()) }.unwrap_or_default())),
        }
    }

    /// init as NCCL does it: once per process before v11, once per communicator from v11 on.
    pub fn init(&mut self, comm_id: u64) -> Result<(), Rc> {
        let logger: Logger = Some(driver_log);
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        unsafe {
            match self.t {
                Table::V8(t) => rc(f!(t.init)(logger)),
                Table::V9(t) => rc(f!(t.init)(logger)),
                Table::V10(t) => rc(f!(t.init)(logger, None)),
                Table::V11(t) => self.init_ctx(f!(t.init), comm_id, logger),
                Table::V12(t) => self.init_ctx(f!(t.init), comm_id, logger),
            }
        }
    }

    // SAFETY: NCCL's net API contract: it passes pointers it owns, valid for the call (documented in ffi.rs's module comment).
    unsafe fn init_ctx(&mut self, init: unsafe extern "C" fn(*mut Ptr, u64, *mut CommConfig, Logger, ProfilerCallback) -> Rc, comm_id: u64, logger: Logger) -> Result<(), Rc> {
        let mut ctx: Ptr = 1 as Ptr; // garbage in: the plugin must overwrite it
        let mut cfg = CommConfig { trafficClass: -1 };
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        rc(unsafe { init(&mut ctx, comm_id, &mut cfg, logger, None) })?;
        if ctx.is_null() {
            return Err(NCCL_INTERNAL_ERROR);
        }
        self.ctxs.push(ctx);
        Ok(())
    }

    fn ctx(&self) -> Ptr {
        self.ctxs.first().copied().unwrap_or(std::ptr::null_mut())
    }

    pub fn finalize_all(&mut self) -> Result<(), Rc> {
        let fin = match self.t {
            Table::V11(t) => t.finalize,
            Table::V12(t) => t.finalize,
            _ => None,
        };
        for ctx in self.ctxs.drain(..) {
            // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
            rc(unsafe { fin.expect("finalize is NULL")(ctx) })?;
        }
        Ok(())
    }

    pub fn devices(&self) -> Result<c_int, Rc> {
        let mut n = -1;
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.devices)(&mut n) }))?;
        Ok(n)
    }

    pub fn props(&self, dev: c_int) -> Result<PropsView, Rc> {
        macro_rules! view {
            ($p:expr, $v:expr) => {
                PropsView {
                    name: cstr($p.name).unwrap_or_default(),
                    pci_path: cstr($p.pciPath),
                    ptr_support: $p.ptrSupport,
                    speed: $p.speed,
                    max_comms: $p.maxComms,
                    max_recvs: $p.maxRecvs,
                    dev_type: $p.netDeviceType,
                    vprops: $v,
                }
            };
        }
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        unsafe {
            match self.t {
                Table::V8(t) => {
                    let mut p: PropertiesV8 = std::mem::zeroed();
                    rc(f!(t.getProperties)(dev, &mut p))?;
                    Ok(view!(p, None))
                }
                Table::V9(t) => {
                    let mut p: PropertiesV9 = std::mem::zeroed();
                    rc(f!(t.getProperties)(dev, &mut p))?;
                    Ok(view!(p, Some((p.vProps.ndevs, p.vProps.devs[0], p.maxP2pBytes))))
                }
                Table::V10(t) => {
                    let mut p: PropertiesV9 = std::mem::zeroed();
                    rc(f!(t.getProperties)(dev, &mut p))?;
                    Ok(view!(p, Some((p.vProps.ndevs, p.vProps.devs[0], p.maxP2pBytes))))
                }
                Table::V11(t) => {
                    let mut p: PropertiesV11 = std::mem::zeroed();
                    rc(f!(t.getProperties)(dev, &mut p))?;
                    Ok(view!(p, Some((p.vProps.ndevs, p.vProps.devs[0], p.maxP2pBytes))))
                }
                Table::V12(t) => {
                    let mut p: PropertiesV12 = std::mem::zeroed();
                    rc(f!(t.getProperties)(dev, &mut p))?;
                    Ok(view!(p, Some((p.vProps.ndevs, p.vProps.devs[0], p.maxP2pBytes))))
                }
            }
        }
    }

    pub fn listen(&self, dev: c_int, handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) -> Result<Ptr, Rc> {
        let mut l: Ptr = std::ptr::null_mut();
        let h = handle.as_mut_ptr() as Ptr;
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        unsafe {
            match self.t {
                Table::V8(t) => rc(f!(t.listen)(dev, h, &mut l))?,
                Table::V9(t) => rc(f!(t.listen)(dev, h, &mut l))?,
                Table::V10(t) => rc(f!(t.listen)(dev, h, &mut l))?,
                Table::V11(t) => rc(f!(t.listen)(self.ctx(), dev, h, &mut l))?,
                Table::V12(t) => rc(f!(t.listen)(self.ctx(), dev, h, &mut l))?,
            }
        }
        opt(l).ok_or(NCCL_INTERNAL_ERROR)
    }

    /// One non-blocking connect step: Some(sendComm) once connected.
    pub fn connect(&self, dev: c_int, handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) -> Result<Option<Ptr>, Rc> {
        let mut c: Ptr = std::ptr::null_mut();
        let mut devh: Ptr = std::ptr::null_mut();
        let h = handle.as_mut_ptr() as Ptr;
        let mut cfg = CommConfig { trafficClass: -1 };
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        unsafe {
            match self.t {
                Table::V8(t) => rc(f!(t.connect)(dev, h, &mut c, &mut devh))?,
                Table::V9(t) => rc(f!(t.connect)(dev, h, &mut c, &mut devh))?,
                Table::V10(t) => rc(f!(t.connect)(dev, &mut cfg, h, &mut c, &mut devh))?,
                Table::V11(t) => rc(f!(t.connect)(self.ctx(), dev, h, &mut c, &mut devh))?,
                Table::V12(t) => rc(f!(t.connect)(self.ctx(), dev, h, &mut c, &mut devh))?,
            }
        }
        Ok(opt(c))
    }

    pub fn accept(&self, l: Ptr) -> Result<Option<Ptr>, Rc> {
        let mut c: Ptr = std::ptr::null_mut();
        let mut devh: Ptr = std::ptr::null_mut();
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.accept)(l, &mut c, &mut devh) }))?;
        Ok(opt(c))
    }

    pub fn reg_mr(&self, comm: Ptr, data: *mut u8, size: usize, ptr_type: c_int) -> Result<Ptr, Rc> {
        let mut mh: Ptr = std::ptr::null_mut();
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.regMr)(comm, data as Ptr, size, ptr_type, &mut mh) }))?;
        Ok(mh)
    }

    pub fn dereg_mr(&self, comm: Ptr, mh: Ptr) -> Result<(), Rc> {
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.deregMr)(comm, mh) }))
    }

    /// # Safety
    /// `data..data+size` must stay valid until the request completes or the comm is closed.
    pub unsafe fn isend(&self, comm: Ptr, data: *const u8, size: usize, tag: c_int, mh: Ptr) -> Result<Option<Ptr>, Rc> {
        let mut r: Ptr = std::ptr::null_mut();
        let d = data as Ptr;
        // SAFETY: the plugin's isend with a buffer the caller keeps valid (this function's contract)
        // and `r`, which outlives the call.
        unsafe {
            match self.t {
                Table::V8(t) => rc(f!(t.isend)(comm, d, c_int::try_from(size).map_err(|_| NCCL_INTERNAL_ERROR)?, tag, mh, &mut r))?,
                Table::V9(t) => rc(f!(t.isend)(comm, d, size, tag, mh, &mut r))?,
                Table::V10(t) => rc(f!(t.isend)(comm, d, size, tag, mh, std::ptr::null_mut(), &mut r))?,
                Table::V11(t) => rc(f!(t.isend)(comm, d, size, tag, mh, std::ptr::null_mut(), &mut r))?,
                Table::V12(t) => rc(f!(t.isend)(comm, d, size, tag, mh, std::ptr::null_mut(), &mut r))?,
            }
        }
        Ok(opt(r))
    }

    /// One-buffer irecv; from v9 on the request starts as NCCL_NET_OPTIONAL_RECV_COMPLETION, as
    /// NCCL leaves it for LL/LL128 receives.
    ///
    /// # Safety
    /// `data..data+cap` must stay valid until the request completes or the comm is closed.
    pub unsafe fn irecv(&self, comm: Ptr, data: *mut u8, cap: usize, tag: c_int, mh: Ptr) -> Result<Option<Ptr>, Rc> {
        let mut r: Ptr = if self.version >= 9 { NCCL_NET_OPTIONAL_RECV_COMPLETION as Ptr } else { std::ptr::null_mut() };
        let mut d = data as Ptr;
        let mut tags = [tag];
        let mut mhs = [mh];
        let mut szs = [cap];
        let mut phs: [Ptr; 1] = [std::ptr::null_mut()];
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        unsafe {
            match self.t {
                Table::V8(t) => {
                    let mut s32 = [c_int::try_from(cap).map_err(|_| NCCL_INTERNAL_ERROR)?];
                    rc(f!(t.irecv)(comm, 1, &mut d, s32.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), &mut r))?
                }
                Table::V9(t) => rc(f!(t.irecv)(comm, 1, &mut d, szs.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), &mut r))?,
                Table::V10(t) => rc(f!(t.irecv)(comm, 1, &mut d, szs.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), phs.as_mut_ptr(), &mut r))?,
                Table::V11(t) => rc(f!(t.irecv)(comm, 1, &mut d, szs.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), phs.as_mut_ptr(), &mut r))?,
                Table::V12(t) => rc(f!(t.irecv)(comm, 1, &mut d, szs.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), phs.as_mut_ptr(), &mut r))?,
            }
        }
        if r as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION {
            return Err(NCCL_INTERNAL_ERROR); // the plugin left NCCL's marker: no real request
        }
        Ok(opt(r))
    }

    /// Some(bytes) once done; the request is gone after Some or an error.
    pub fn test(&self, req: Ptr) -> Result<Option<usize>, Rc> {
        let mut done: c_int = 0;
        let mut size: c_int = -1;
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.test)(req, &mut done, &mut size) }))?;
        if done == 0 {
            return Ok(None);
        }
        usize::try_from(size).map(Some).map_err(|_| NCCL_INTERNAL_ERROR)
    }

    /// iflush on host memory: the plugin must say no flush is needed (NULL request).
    pub fn iflush_is_noop(&self, recv_comm: Ptr, data: *mut u8, size: c_int, mh: Ptr) -> Result<bool, Rc> {
        let mut r: Ptr = 1 as Ptr;
        let mut d = data as Ptr;
        let mut s = [size];
        let mut m = [mh];
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.iflush)(recv_comm, 1, &mut d, s.as_mut_ptr(), m.as_mut_ptr(), &mut r) }))?;
        Ok(r.is_null())
    }

    pub fn close_send(&self, c: Ptr) -> Result<(), Rc> {
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.closeSend)(c) }))
    }

    pub fn close_recv(&self, c: Ptr) -> Result<(), Rc> {
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.closeRecv)(c) }))
    }

    pub fn close_listen(&self, c: Ptr) -> Result<(), Rc> {
        // SAFETY: NCCL's (or the test driver's) pointer arguments, valid for the call under the net API contract.
        each!(self, t => rc(unsafe { f!(t.closeListen)(c) }))
    }
}
