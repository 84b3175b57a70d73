//! Logging through the function NCCL hands to `init`, so the plugin's lines appear in NCCL's log
//! with NCCL's prefixes and obey NCCL_DEBUG / NCCL_DEBUG_SUBSYS. Before `init` (or when a caller
//! passes no logger) warnings go to stderr and the rest is dropped.
use crate::abi::{LogFn, Logger, NCCL_LOG_INFO, NCCL_LOG_WARN, NCCL_NET};
use std::ffi::{c_ulong, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The logger from the latest `init`, as an address (0 = none). Every NCCL communicator passes the
/// same function, so the latest is as good as any.
static LOGGER: AtomicUsize = AtomicUsize::new(0);

pub fn set_logger(logger: Logger) {
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
}

fn logger() -> Logger {
    let addr = LOGGER.load(Ordering::Acquire);
    if addr == 0 {
        return None;
    }
    // SAFETY: a non-zero value was stored from a function pointer of exactly this type.
    Some(unsafe { std::mem::transmute::<usize, LogFn>(addr) })
}

fn emit(level: std::ffi::c_int, flags: c_ulong, msg: &str) {
    match logger() {
        Some(f) => {
            // NUL bytes cannot appear in a C string: replace them rather than lose the line.
            let text = CString::new(msg.replace('\0', "?")).unwrap_or_default();
            // The message goes through "%s", never as the format, so a '%' in it is harmless.
            // SAFETY: NCCL's logger is printf-like; both strings are NUL-terminated and live
            // across the call.
            unsafe { f(level, flags, c"wirespeed".as_ptr(), 0, c"%s".as_ptr(), text.as_ptr()) };
        }
        None if level == NCCL_LOG_WARN => eprintln!("NET/wirespeed WARN {msg}"),
        None => {}
    }
}

pub fn warn(msg: &str) {
    emit(NCCL_LOG_WARN, NCCL_NET, &format!("NET/wirespeed : {msg}"));
}

pub fn info(flags: c_ulong, msg: &str) {
    emit(NCCL_LOG_INFO, flags | NCCL_NET, &format!("NET/wirespeed : {msg}"));
}
