//! The C ABI of NCCL's network plugin interface, versions 8 to 12, written from the layouts in
//! NCCL's plugin headers (ext-net/, later plugins/net/, `net_vN.h`). Only what a host-memory TCP
//! plugin needs is typed precisely; device-offload types are opaque pointers.
//!
//! Which NCCL looks for which symbol (newest first): 2.20-2.23 load v8, 2.24-2.25 v9, 2.26-2.27
//! v10, 2.28-2.29 v11 (PyTorch 2.11 ships 2.28.9), 2.30 v12. What changes between versions:
//! - v9: sizes become size_t; the properties gain `forceFlush` (before `speed`, which shifts every
//!   later field), `vProps`, `maxP2pBytes`, `maxCollBytes`; the table gains `makeVDevice`.
//! - v10: `init` takes a profiler callback; `connect` a per-connection config; isend/irecv an
//!   opaque profiler handle.
//! - v11: `init` runs once per communicator and returns a context that `listen`/`connect` receive
//!   and `finalize` frees; the properties gain `maxMultiRequestSize`; the table gains `finalize`
//!   and `setNetAttr` (NCCL's hint of how many peers and flows it drives at once: `NetAttr`).
//! - v12: `vProps.devs` grows from 4 to 8 entries; the properties gain `railId`/`planeId`.
//!
//! The sizes below are checked at compile time against what the C compiler gives for NCCL's
//! headers on LP64 Linux (64, 104, 104, 112, 128 bytes; `NetAttr` 44).
//!
//! The `unsafe extern "C" fn` types of the tables are the plugin's entry points: NCCL calls them
//! under the pointer contract written in ffi.rs's module doc (`# Safety`). `LogFn` goes the other
//! way: NCCL's logger, which the plugin calls (log.rs).
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// ncclResult_t (an int-sized C enum).
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;

/// Bytes NCCL reserves for the handle `listen` writes and `connect` reads.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// Requests each comm must take in flight at once (per receive of a multi-receive).
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// What NCCL (v9+) may leave in `*request` before irecv for LL/LL128 receives.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;
/// NCCL_MAX_NET_SIZE_BYTES: the largest single transfer a plugin may announce (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;

// ncclDebugLogLevel and the subsystem flags.
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_TRACE: c_int = 5;
pub const NCCL_INIT: c_ulong = 1;
pub const NCCL_NET: c_ulong = 16;
pub const NCCL_ENV: c_ulong = 128;

/// ncclDebugLogger_t: `void (*)(level, flags, file, line, fmt, ...)`.
// SAFETY: `LogFn` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type LogFn = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);
pub type Logger = Option<LogFn>;
/// ncclProfilerCallback_t (unused: the plugin records no profiler events).
// SAFETY: `ProfilerCallback` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type ProfilerCallback = Option<unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> NcclResult>;

pub const MAX_DEVS_PER_NIC_V9: usize = 4;
pub const MAX_DEVS_PER_NIC_V12: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VDeviceProps<const N: usize> {
    pub ndevs: c_int,
    pub devs: [c_int; N],
}

/// ncclNetCommConfig_v10_t .. _v12_t.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommConfig {
    pub trafficClass: c_int,
}

/// Writes a properties struct, `#[repr(C)]`: ncclNetProperties_v8_t's fields with `$mid` after
/// `regIsGlobal` and `$more` at the end. `v9 Name, DEVS { more }` is one of v9 on: `forceFlush`
/// after `regIsGlobal`, then v9's `vProps` (up to DEVS devices), `maxP2pBytes` and `maxCollBytes`,
/// then what the version appends.
macro_rules! properties {
    ($(#[$doc:meta])* v9 $name:ident, $devs:ident { $($more:ident: $more_ty:ty,)* }) => {
        properties! {
            $(#[$doc])*
            $name { forceFlush: c_int, } {
                vProps: VDeviceProps<$devs>,
                maxP2pBytes: usize,
                maxCollBytes: usize,
                $($more: $more_ty,)*
            }
        }
    };
    ($(#[$doc:meta])* $name:ident { $($mid:ident: $mid_ty:ty,)* } { $($more:ident: $more_ty:ty,)* }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            pub name: *mut c_char,
            pub pciPath: *mut c_char,
            pub guid: u64,
            pub ptrSupport: c_int,
            pub regIsGlobal: c_int,
            $(pub $mid: $mid_ty,)*
            pub speed: c_int,
            pub port: c_int,
            pub latency: f32,
            pub maxComms: c_int,
            pub maxRecvs: c_int,
            pub netDeviceType: c_int,
            pub netDeviceVersion: c_int,
            $(pub $more: $more_ty,)*
        }
    };
}

properties! {
    PropertiesV8 {} {}
}

properties! {
    /// v9 and v10 share this layout.
    v9 PropertiesV9, MAX_DEVS_PER_NIC_V9 {}
}

properties! {
    v9 PropertiesV11, MAX_DEVS_PER_NIC_V9 {
        maxMultiRequestSize: c_int,
    }
}

properties! {
    v9 PropertiesV12, MAX_DEVS_PER_NIC_V12 {
        maxMultiRequestSize: c_int,
        railId: i16,
        planeId: i16,
    }
}

// Layouts as NCCL's headers give them (LP64): a wrong field order or width fails the build.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<PropertiesV8>() == 64);
    assert!(offset_of!(PropertiesV8, speed) == 32);
    assert!(offset_of!(PropertiesV8, netDeviceVersion) == 56);
    assert!(size_of::<PropertiesV9>() == 104);
    assert!(offset_of!(PropertiesV9, speed) == 36);
    assert!(offset_of!(PropertiesV9, vProps) == 64);
    assert!(offset_of!(PropertiesV9, maxP2pBytes) == 88);
    assert!(size_of::<PropertiesV11>() == 112);
    assert!(offset_of!(PropertiesV11, maxMultiRequestSize) == 104);
    assert!(size_of::<PropertiesV12>() == 128);
    assert!(offset_of!(PropertiesV12, maxP2pBytes) == 104);
    assert!(offset_of!(PropertiesV12, railId) == 124);
};

/// NCCL_NET_ATTR_UNDEF: a field of the attributes below that NCCL leaves unsaid (-1; the `u32`
/// masks hold it as 0xffffffff).
pub const NCCL_NET_ATTR_UNDEF: i32 = -1;

/// ncclNetCommAttr_v11_t / _v12_t: how many peers, and flows (channels) per peer, NCCL may drive
/// at once through one direction of a communicator.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetCommAttr {
    pub maxConcurrentPeers: i32,
    pub minConcurrentPeers: i32,
    pub maxFlowsPerPeer: i32,
    pub minFlowsPerPeer: i32,
}

/// ncclNetAttr_v11_t / _v12_t (the same layout): what `setNetAttr` hands the plugin. `op`, `algo`
/// and `proto` are bit masks of NCCL's collective, algorithm and protocol enums.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetAttr {
    pub sendCommAttr: NetCommAttr,
    pub recvCommAttr: NetCommAttr,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<NetCommAttr>() == 16);
    assert!(offset_of!(NetCommAttr, maxFlowsPerPeer) == 8);
    assert!(size_of::<NetAttr>() == 44);
    assert!(align_of::<NetAttr>() == 4);
    assert!(offset_of!(NetAttr, recvCommAttr) == 16);
    assert!(offset_of!(NetAttr, op) == 32);
    assert!(offset_of!(NetAttr, proto) == 40);
};

type P = *mut c_void;
type PP = *mut *mut c_void;

/// Entries every version shares, in table order after `getProperties`/`listen`/`connect`/`accept`.
// SAFETY: `RegMr` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type RegMr = Option<unsafe extern "C" fn(P, P, usize, c_int, PP) -> NcclResult>;
// SAFETY: `RegMrDmaBuf` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type RegMrDmaBuf = Option<unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, PP) -> NcclResult>;
// SAFETY: `DeregMr` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type DeregMr = Option<unsafe extern "C" fn(P, P) -> NcclResult>;
// SAFETY: `Iflush` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type Iflush = Option<unsafe extern "C" fn(P, c_int, PP, *mut c_int, PP, PP) -> NcclResult>;
// SAFETY: `Test` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type Test = Option<unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> NcclResult>;
// SAFETY: `Close` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type Close = Option<unsafe extern "C" fn(P) -> NcclResult>;
// SAFETY: `GetDeviceMr` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type GetDeviceMr = Option<unsafe extern "C" fn(P, P, PP) -> NcclResult>;
// SAFETY: `IrecvConsumed` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type IrecvConsumed = Option<unsafe extern "C" fn(P, c_int, P) -> NcclResult>;
// SAFETY: `Devices` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type Devices = Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>;
// SAFETY: `Accept` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type Accept = Option<unsafe extern "C" fn(P, PP, PP) -> NcclResult>;
// SAFETY: `MakeVDevice` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type MakeVDevice = Option<unsafe extern "C" fn(*mut c_int, P) -> NcclResult>;

// SAFETY: `Finalize` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type Finalize = Option<unsafe extern "C" fn(P) -> NcclResult>;
// SAFETY: `SetNetAttr` only names a C function-pointer type; calling one is unsafe because the callee trusts its pointers, which ffi.rs's contract spells out
pub type SetNetAttr = Option<unsafe extern "C" fn(P, *mut NetAttr) -> NcclResult>;

/// Writes one version's ncclNet_vN_t, `#[repr(C)]`, in NCCL's table order: `name`, the entries
/// every version has (those whose C signature the version fixes, `init`, `getProperties`' struct,
/// `listen`, `connect`, `isend` and `irecv`, given per version), then the entries the version
/// appends. Also its `Sync`: the tables are immutable statics that NCCL reads from any thread.
macro_rules! net_table {
    (
        $(#[$doc:meta])*
        $name:ident $(<$g:ident>)? {
            init: fn($($init:ty),*),
            getProperties: $props:ty,
            listen: fn($($listen:ty),*),
            connect: fn($($connect:ty),*),
            isend: fn($($isend:ty),*),
            irecv: fn($($irecv:ty),*),
            $($more:ident: $more_ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        pub struct $name $(<$g>)? {
            pub name: *const c_char,
            // SAFETY: the type of this version's `init` entry, which NCCL calls with the pointers its net API (this version) defines; ffi.rs's entries take them under the contract written there
            pub init: Option<unsafe extern "C" fn($($init),*) -> NcclResult>,
            pub devices: Devices,
            // SAFETY: the type of this version's `getProperties` entry, which NCCL calls with the pointers its net API (this version) defines; ffi.rs's entries take them under the contract written there
            pub getProperties: Option<unsafe extern "C" fn(c_int, *mut $props) -> NcclResult>,
            // SAFETY: the type of this version's `listen` entry, which NCCL calls with the pointers its net API (this version) defines; ffi.rs's entries take them under the contract written there
            pub listen: Option<unsafe extern "C" fn($($listen),*) -> NcclResult>,
            // SAFETY: the type of this version's `connect` entry, which NCCL calls with the pointers its net API (this version) defines; ffi.rs's entries take them under the contract written there
            pub connect: Option<unsafe extern "C" fn($($connect),*) -> NcclResult>,
            pub accept: Accept,
            pub regMr: RegMr,
            pub regMrDmaBuf: RegMrDmaBuf,
            pub deregMr: DeregMr,
            // SAFETY: the type of this version's `isend` entry, which NCCL calls with the pointers its net API (this version) defines; ffi.rs's entries take them under the contract written there
            pub isend: Option<unsafe extern "C" fn($($isend),*) -> NcclResult>,
            // SAFETY: the type of this version's `irecv` entry, which NCCL calls with the pointers its net API (this version) defines; ffi.rs's entries take them under the contract written there
            pub irecv: Option<unsafe extern "C" fn($($irecv),*) -> NcclResult>,
            pub iflush: Iflush,
            pub test: Test,
            pub closeSend: Close,
            pub closeRecv: Close,
            pub closeListen: Close,
            pub getDeviceMr: GetDeviceMr,
            pub irecvConsumed: IrecvConsumed,
            $(pub $more: $more_ty,)*
        }

        // SAFETY: the table holds `name`, a pointer to the 'static C string ffi::NAME, and function
        // pointers (a type parameter is the properties type, named only in a fn-pointer signature,
        // never stored); the statics are never written, so threads only share reads.
        unsafe impl $(<$g>)? Sync for $name $(<$g>)? {}
    };
}

net_table! {
    /// ncclNet_v8_t.
    NetV8 {
        init: fn(Logger),
        getProperties: PropertiesV8,
        listen: fn(c_int, P, PP),
        connect: fn(c_int, P, PP, PP),
        isend: fn(P, P, c_int, c_int, P, PP),
        irecv: fn(P, c_int, PP, *mut c_int, *mut c_int, PP, PP),
    }
}

net_table! {
    /// ncclNet_v9_t.
    NetV9 {
        init: fn(Logger),
        getProperties: PropertiesV9,
        listen: fn(c_int, P, PP),
        connect: fn(c_int, P, PP, PP),
        isend: fn(P, P, usize, c_int, P, PP),
        irecv: fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP),
        makeVDevice: MakeVDevice,
    }
}

net_table! {
    /// ncclNet_v10_t.
    NetV10 {
        init: fn(Logger, ProfilerCallback),
        getProperties: PropertiesV9,
        listen: fn(c_int, P, PP),
        connect: fn(c_int, *mut CommConfig, P, PP, PP),
        isend: fn(P, P, usize, c_int, P, P, PP),
        irecv: fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP, PP),
        makeVDevice: MakeVDevice,
    }
}

net_table! {
    /// ncclNet_v11_t and (with `Props = PropertiesV12`) ncclNet_v12_t: the same table,
    /// per-communicator contexts.
    NetV11<Props> {
        init: fn(PP, u64, *mut CommConfig, Logger, ProfilerCallback),
        getProperties: Props,
        listen: fn(P, c_int, P, PP),
        connect: fn(P, c_int, P, PP, PP),
        isend: fn(P, P, usize, c_int, P, P, PP),
        irecv: fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP, PP),
        makeVDevice: MakeVDevice,
        finalize: Finalize,
        setNetAttr: SetNetAttr,
    }
}

pub type NetV12 = NetV11<PropertiesV12>;

const _: () = {
    use std::mem::size_of;
    let ptr = size_of::<usize>();
    assert!(size_of::<NetV8>() == 19 * ptr);
    assert!(size_of::<NetV9>() == 20 * ptr);
    assert!(size_of::<NetV10>() == 20 * ptr);
    assert!(size_of::<NetV11<PropertiesV11>>() == 22 * ptr);
};
