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

/// One loaded plugin. The methods that take a comm or request `Ptr` are not marked unsafe: the
/// scenarios pass only what the plugin returned to this `Net` (comms until closed, requests until
/// tested done), and the SAFETY lines below rely on that.
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

/// A copy of the C string at `p`, or None for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string alive for the call.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    // SAFETY: non-NULL here, so by this fn's contract a live C string.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Net {
    pub fn open(lib: &str, version: u32) -> Result<Net, String> {
        let path = CString::new(lib).map_err(|_| "bad library path".to_string())?;
        // SAFETY: `path` is a CString alive for the call.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a C string valid until the next dl* call of this
            // thread; cstr copies it at once.
            let why = unsafe { cstr(libc::dlerror()) }.unwrap_or_default();
            return Err(format!("dlopen {lib}: {why}"));
        }
        let sym = CString::new(format!("ncclNetPlugin_v{version}")).unwrap();
        // SAFETY: `h` is the handle dlopen just returned, `sym` a CString alive for the call.
        let p = unsafe { libc::dlsym(h, sym.as_ptr()) };
        if p.is_null() {
            return Err(format!("{lib} exports no {}", sym.to_string_lossy()));
        }
        // SAFETY: the symbol is the plugin's static table of this version (what the test checks),
        // valid while the library is loaded: until `unload`, which consumes this Net.
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
        // SAFETY: `p` is that table (above); its `name` points to the plugin's static C string.
        let name = unsafe { cstr(*(p as *const *const c_char)) }.unwrap_or_default();
        Ok(Net { lib: h, t, version, name, ctxs: vec![] })
    }

    /// dlclose the library, as NCCL does when its last communicator is destroyed.
    pub fn unload(self) -> Result<(), String> {
        // SAFETY: the handle from dlopen; nothing of the library is used after this.
        match unsafe { libc::dlclose(self.lib) } {
            0 => Ok(()),
            // SAFETY: as in `open`: dlerror's string, copied at once.
            _ => Err(format!("dlclose: {}", unsafe { cstr(libc::dlerror()) }.unwrap_or_default())),
        }
    }

    /// init as NCCL does it: once per process before v11, once per communicator from v11 on.
    pub fn init(&mut self, comm_id: u64) -> Result<(), Rc> {
        let logger: Logger = Some(driver_log);
        // SAFETY: each version's init with its own argument types: the logger is driver_log, a C
        // variadic function of ncclDebugLogger_t's type (logger.c), the profiler callback None;
        // init_ctx's contract holds for the v11/v12 entries.
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

    /// # Safety
    /// `init` is the init entry of this Net's v11 or v12 table.
    unsafe fn init_ctx(&mut self, init: unsafe extern "C" fn(*mut Ptr, u64, *mut CommConfig, Logger, ProfilerCallback) -> Rc, comm_id: u64, logger: Logger) -> Result<(), Rc> {
        let mut ctx: Ptr = 1 as Ptr; // garbage in: the plugin must overwrite it
        let mut cfg = CommConfig { trafficClass: -1 };
        // SAFETY: this fn's contract: the plugin's init; `ctx` (garbage the plugin must
        // overwrite) and `cfg` are locals that outlive the call.
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
            // SAFETY: `ctx` is a context this Net's init got from the plugin, finalized once
            // (drained from `ctxs`).
            rc(unsafe { fin.expect("finalize is NULL")(ctx) })?;
        }
        Ok(())
    }

    /// setNetAttr on this Net's first context, as NCCL's proxy calls it before each connect and
    /// accept (v11+; None for the versions without it).
    pub fn set_net_attr(&self, attr: &NetAttr) -> Option<Result<(), Rc>> {
        let set = match self.t {
            Table::V11(t) => t.setNetAttr,
            Table::V12(t) => t.setNetAttr,
            _ => None,
        }?;
        let mut a = *attr;
        // SAFETY: the plugin's setNetAttr with a context its init returned (not finalized) and
        // `a`, a local ncclNetAttr_t alive for the call.
        Some(rc(unsafe { set(self.ctx(), &mut a) }))
    }

    pub fn devices(&self) -> Result<c_int, Rc> {
        let mut n = -1;
        // SAFETY: `n` is a local c_int for the out-parameter.
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
        // SAFETY: `p` is a local of the version's properties struct, zeroed (integers and
        // pointers, for which zero is valid) and filled by the call; `view!` reads its
        // `name` and `pciPath` (NULL or the plugin's static device strings) through cstr.
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
        // SAFETY: `h` is the caller's NCCL_NET_HANDLE_MAXSIZE-byte array and `l` a local
        // out-parameter, both alive for the call; v11/v12 add this Net's first context.
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
        // SAFETY: `h` is the caller's handle array, kept unchanged across calls as NCCL does;
        // `c`, `devh` and `cfg` are locals alive for the call.
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
        // SAFETY: `l` is the listen comm `listen` returned (setup's), not closed; `c` and `devh`
        // are local out-parameters.
        each!(self, t => rc(unsafe { f!(t.accept)(l, &mut c, &mut devh) }))?;
        Ok(opt(c))
    }

    pub fn reg_mr(&self, comm: Ptr, data: *mut u8, size: usize, ptr_type: c_int) -> Result<Ptr, Rc> {
        let mut mh: Ptr = std::ptr::null_mut();
        // SAFETY: `comm` is one of this Net's comms and `mh` a local out-parameter; the plugin
        // does not read `data`.
        each!(self, t => rc(unsafe { f!(t.regMr)(comm, data as Ptr, size, ptr_type, &mut mh) }))?;
        Ok(mh)
    }

    pub fn dereg_mr(&self, comm: Ptr, mh: Ptr) -> Result<(), Rc> {
        // SAFETY: the plugin's deregMr reads neither pointer.
        each!(self, t => rc(unsafe { f!(t.deregMr)(comm, mh) }))
    }

    /// # Safety
    /// `comm` is a send comm from `connect`, not closed; `data..data+size` must stay valid and
    /// unchanged until the request completes or the comm is closed.
    pub unsafe fn isend(&self, comm: Ptr, data: *const u8, size: usize, tag: c_int, mh: Ptr) -> Result<Option<Ptr>, Rc> {
        let mut r: Ptr = std::ptr::null_mut();
        let d = data as Ptr;
        // SAFETY: the plugin's isend with this fn's `comm` and buffer (its contract is the
        // plugin's) and `r`, a local out-parameter.
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
    /// `comm` is a receive comm from `accept`, not closed; `data..data+cap` must stay valid, and
    /// untouched by the caller, until the request completes or the comm is closed.
    pub unsafe fn irecv(&self, comm: Ptr, data: *mut u8, cap: usize, tag: c_int, mh: Ptr) -> Result<Option<Ptr>, Rc> {
        let mut r: Ptr = if self.version >= 9 { NCCL_NET_OPTIONAL_RECV_COMPLETION as Ptr } else { std::ptr::null_mut() };
        let mut d = data as Ptr;
        let mut tags = [tag];
        let mut mhs = [mh];
        let mut szs = [cap];
        let mut phs: [Ptr; 1] = [std::ptr::null_mut()];
        // SAFETY: the plugin's irecv with this fn's `comm` and buffer (its contract is the
        // plugin's); `d`, the sizes, `tags`, `mhs` and `phs` are one-entry local arrays (n = 1)
        // and `r` a local out-parameter, all alive for the call.
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
        // SAFETY: `req` is a request the plugin returned and has not yet reported done (the
        // scenarios stop testing one once it is); `done` and `size` are local out-parameters.
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
        // SAFETY: `recv_comm` is this Net's receive comm; `d`, `s` and `m` are one-entry local
        // arrays and `r` a local out-parameter; the plugin reads none of the data.
        each!(self, t => rc(unsafe { f!(t.iflush)(recv_comm, 1, &mut d, s.as_mut_ptr(), m.as_mut_ptr(), &mut r) }))?;
        Ok(r.is_null())
    }

    pub fn close_send(&self, c: Ptr) -> Result<(), Rc> {
        // SAFETY: `c` is the send comm `connect` returned, closed once (close_all).
        each!(self, t => rc(unsafe { f!(t.closeSend)(c) }))
    }

    pub fn close_recv(&self, c: Ptr) -> Result<(), Rc> {
        // SAFETY: `c` is the receive comm `accept` returned, closed once (close_all).
        each!(self, t => rc(unsafe { f!(t.closeRecv)(c) }))
    }

    pub fn close_listen(&self, c: Ptr) -> Result<(), Rc> {
        // SAFETY: `c` is the listen comm `listen` returned, closed once (close_all).
        each!(self, t => rc(unsafe { f!(t.closeListen)(c) }))
    }
}
