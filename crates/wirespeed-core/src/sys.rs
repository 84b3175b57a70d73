//! Thin, safe-ish wrappers over the Linux calls the shared-memory transport needs: anonymous
//! memory files (memfd, so nothing ever appears in /dev/shm), shared mappings, futexes, pidfds to
//! notice a dead peer, and cross-memory attach (process_vm_readv) to read a peer's buffer in place.
//!
//! Linux calls only (the copy kernels are in kernels/copy.rs). Who uses it: the shared-memory
//! group (shm/: segments, waits, peer reads and writes), the TCP engine (transport/tcp/: the CPU
//! count behind its thread default), the groups and their tests (`random_token`), config.rs
//! (`host_id`, behind `Config::host_id`), the Python bindings (`random_token`), the NCCL
//! plugin (`random_bytes` for its handle's key) and the open-file budget of a multi-host group
//! (hosts/fds.rs: the RLIMIT_NOFILE limits and the count of open descriptors).
use crate::error::{Error, Result};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A MAP_SHARED mapping, unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// The mapping is plain shared memory; all concurrent access goes through atomics or through
// byte ranges the protocol hands to exactly one writer at a time.
// SAFETY: a Mapping is a pointer and length, valid until its drop unmaps them, whichever thread
// that is; nothing in it is tied to the thread that mapped it.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` gives out only the pointer and the length; the memory behind them is shared
// with other processes anyway, and its users (shm/segment.rs) reach it through atomics or through
// ranges the protocol gives one writer at a time.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are what mmap returned in map_fd; unmapped once, here, when the
        // last owner (Segs share it by Arc) lets go.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

fn map_fd(fd: i32, len: usize) -> Result<Mapping> {
    // SAFETY: no pointer arguments (a null hint lets the kernel choose); `fd` is an open
    // descriptor the caller holds across the call.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(Error::os("mmap"));
    }
    Ok(Mapping { ptr: p as *mut u8, len })
}

/// Create an anonymous memory file of `len` bytes and map it. The fd stays open so peers can open
/// it through /proc/<pid>/fd/<fd>; it vanishes with the last process that maps it, crash or not.
pub fn memfd_segment(len: usize) -> Result<(i32, Mapping)> {
    let name = b"wirespeed\0";
    // SAFETY: `name` is a NUL-terminated static byte string.
    let fd = unsafe { libc::memfd_create(name.as_ptr() as *const libc::c_char, libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::os("memfd_create"));
    }
    // SAFETY: integer arguments only; `fd` is the memfd just created.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        let e = Error::os("ftruncate");
        // SAFETY: closes that memfd, once: on this error path nobody else gets it.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    match map_fd(fd, len) {
        Ok(m) => Ok((fd, m)),
        Err(e) => {
            // SAFETY: closes the memfd created above, once: on this error path nobody else gets it.
            unsafe { libc::close(fd) };
            Err(e)
        }
    }
}

/// Map a peer's memory file, reached through its /proc entry (needs the same ptrace rights as
/// cross-memory attach, so one permission check covers both).
pub fn map_peer_segment(pid: i32, fd: i32) -> Result<Mapping> {
    let path = format!("/proc/{pid}/fd/{fd}\0");
    // SAFETY: `path` is NUL-terminated (the format ends in \0) and lives across the call.
    let pfd = unsafe { libc::open(path.as_ptr() as *const libc::c_char, libc::O_RDWR | libc::O_CLOEXEC) };
    if pfd < 0 {
        return Err(Error::os("open(/proc/<peer>/fd/<memfd>)"));
    }
    // SAFETY: a plain C struct for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `pfd` is open; `st` is a local stat for the call to fill.
    if unsafe { libc::fstat(pfd, &mut st) } != 0 {
        let e = Error::os("fstat");
        // SAFETY: closes `pfd`, opened above, once, on this error path.
        unsafe { libc::close(pfd) };
        return Err(e);
    }
    let r = map_fd(pfd, st.st_size as usize);
    // SAFETY: closes `pfd`, opened above, once: a mapping keeps the memory, not the descriptor.
    unsafe { libc::close(pfd) };
    r
}

pub fn close_fd(fd: i32) {
    // SAFETY: close touches no memory of ours. Its callers (Comm's `connect` and `drop`) pass
    // their own memfd, once: they set it to -1 after.
    unsafe {
        libc::close(fd);
    }
}

/// While one lives, processes of this user may read this one's memory (process_vm_readv) even
/// under Yama's ptrace_scope 1: the shared-memory transport reads peers' buffers in place. The
/// process-wide setting is reverted when the last group holding one is dropped.
pub struct AttachGuard(());

static ATTACH_USERS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

/// Allow any process of ours to attach to this one (Yama ptrace_scope=1 otherwise forbids
/// siblings from using process_vm_readv on each other), for as long as the guard lives.
/// Harmless where Yama is absent.
pub fn allow_peers_to_attach() -> AttachGuard {
    let mut n = ATTACH_USERS.lock().unwrap_or_else(|p| p.into_inner());
    if *n == 0 {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    }
    *n += 1;
    AttachGuard(())
}

impl Drop for AttachGuard {
    fn drop(&mut self) {
        let mut n = ATTACH_USERS.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        if *n == 0 {
            // SAFETY: as above; 0 restores the default (only ancestors may attach).
            unsafe { libc::prctl(libc::PR_SET_PTRACER, 0, 0, 0, 0) };
        }
    }
}

pub fn getpid() -> i32 {
    // SAFETY: no arguments; getpid cannot fail.
    unsafe { libc::getpid() }
}

/// CPUs this process may run on: decides whether waits may spin or must yield.
pub fn cpus_available() -> usize {
    // SAFETY: cpu_set_t is plain data for which all-zero bytes are valid, and sched_getaffinity writes only into this local.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let n = libc::CPU_COUNT(&set);
            if n > 0 {
                return n as usize;
            }
        }
    }
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

pub fn sched_yield() {
    // SAFETY: no arguments.
    unsafe {
        libc::sched_yield();
    }
}

/// Sleep while `*word == expected`, at most `timeout`. Shared (not private) futex: the word lives in
/// memory mapped by several processes.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: `word` is a live AtomicU32 (a u32 the kernel only reads), `ts` a local timespec;
    // the other pointer arguments are null, which FUTEX_WAIT ignores.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32 as *const u32,
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live AtomicU32; FUTEX_WAKE reads no other pointer (both are null).
    unsafe {
        libc::syscall(libc::SYS_futex, word as *const AtomicU32 as *const u32, libc::FUTEX_WAKE, i32::MAX,
            std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0u32);
    }
}

/// A handle on a peer process that becomes readable when it exits (zombie or reaped, no pid reuse).
pub struct PidFd(i32);

impl PidFd {
    pub fn open(pid: i32) -> Result<PidFd> {
        // SAFETY: integer arguments only.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd < 0 {
            return Err(Error::os("pidfd_open"));
        }
        Ok(PidFd(fd))
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        // SAFETY: closes the pidfd this PidFd owns, once: in its drop.
        unsafe { libc::close(self.0) };
    }
}

/// Index (into `fds`) of the first process that has exited, if any. Never blocks.
pub fn first_exited(fds: &[Option<PidFd>]) -> Option<usize> {
    let mut polls: Vec<libc::pollfd> = Vec::with_capacity(fds.len());
    let mut idx = Vec::with_capacity(fds.len());
    for (i, f) in fds.iter().enumerate() {
        if let Some(f) = f {
            polls.push(libc::pollfd { fd: f.0, events: libc::POLLIN, revents: 0 });
            idx.push(i);
        }
    }
    if polls.is_empty() {
        return None;
    }
    // SAFETY: `polls` is a live Vec of polls.len() pollfd entries; poll writes only their
    // `revents`.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 0) };
    if n <= 0 {
        return None;
    }
    polls.iter().zip(idx).find(|(p, _)| p.revents != 0).map(|(_, i)| i)
}

/// Copy `len` bytes at `remote` in process `pid` to `local`. Err(errno) on failure; ESRCH means the
/// peer is gone.
///
/// # Safety
/// `local` must be valid for writes of `len` bytes (the remote side is checked by the kernel).
pub unsafe fn read_peer(pid: i32, remote: u64, local: *mut u8, len: usize) -> std::result::Result<(), i32> {
    // SAFETY: this fn's contract (`local` writable for `len` bytes) is peer_copy's for a read.
    unsafe { peer_copy(pid, remote, local, len, false) }
}

/// Copy `len` bytes at `local` to `remote` in process `pid` (process_vm_writev); errors as `read_peer`.
///
/// # Safety
/// `local` must be valid for reads of `len` bytes; the caller must own the remote range for the
/// op (the peer published it for this rank to fill; the kernel checks it is mapped and writable).
pub unsafe fn write_peer(pid: i32, remote: u64, local: *const u8, len: usize) -> std::result::Result<(), i32> {
    // SAFETY: this fn's contract is peer_copy's for a write, which only reads through `local`
    // (the cast to *mut is for the shared iovec type).
    unsafe { peer_copy(pid, remote, local as *mut u8, len, true) }
}

/// process_vm_readv (`write` false) or process_vm_writev (`write` true), retried until all
/// `len` bytes have moved.
///
/// # Safety
/// `read_peer`'s contract when `write` is false (`local` writable for `len` bytes), `write_peer`'s
/// when it is true (`local` readable, the remote range given to this rank to fill).
unsafe fn peer_copy(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> std::result::Result<(), i32> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: done < len, so local + done stays inside the caller's `len` bytes.
        let liov = libc::iovec { iov_base: unsafe { local.add(done) } as *mut libc::c_void, iov_len: len - done };
        let riov = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: both iovecs outlive the call; the local one covers memory the contract lets us
        // write (a read) or read (a write), and the kernel checks the remote one.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &liov, 1, &riov, 1, 0)
            } else {
                libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0)
            }
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        if n == 0 {
            return Err(libc::EFAULT);
        }
        done += n as usize;
    }
    Ok(())
}

/// Identity of the machine (hostname + boot id): ranks with equal ids may share memory.
/// `given` overrides it where not empty (WIRESPEED_HOSTID, as NCCL_HOSTID does: config.rs reads
/// it), so ranks of one machine can be made to talk TCP to each other: tests of the multi-host
/// path without network namespaces.
pub fn host_id(given: Option<&str>) -> String {
    if let Some(h) = given.filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", host.trim(), boot.trim())
}

/// Fill `buf` from the kernel's random source. A failed random source is an error of its own,
/// never fixed bytes (a predictable token or key would let any local process pass a handshake).
pub fn random_bytes(buf: &mut [u8]) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most buf.len() - got bytes into `buf` from offset `got`.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr() as *mut libc::c_void, buf.len() - got, 0) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(Error::os("getrandom (the kernel's random source)"));
        }
        got += n as usize;
    }
    Ok(())
}

/// A job's random token: 16 bytes from the kernel's random source.
pub fn random_token() -> Result<[u8; 16]> {
    let mut t = [0u8; 16];
    random_bytes(&mut t)?;
    Ok(t)
}

/// This process's open-file limits (RLIMIT_NOFILE): (soft, hard).
pub fn nofile_limits() -> Result<(u64, u64)> {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `l`, a live local of that type.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(Error::os("getrlimit(RLIMIT_NOFILE)"));
    }
    // (rlim_t is 32 bits on 32-bit targets)
    #[allow(clippy::unnecessary_cast)]
    Ok((l.rlim_cur as u64, l.rlim_max as u64))
}

/// Set the soft open-file limit to `soft`, keeping the hard one (an unprivileged process may
/// move its soft limit anywhere up to its hard limit).
pub fn set_nofile_soft(soft: u64) -> Result<()> {
    let (_, hard) = nofile_limits()?;
    let l = libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
    // SAFETY: setrlimit only reads the rlimit behind the pointer, a live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
        return Err(Error::os("setrlimit(RLIMIT_NOFILE)"));
    }
    Ok(())
}

/// The most files any process may have open (fs.nr_open): a hard limit above it (RLIM_INFINITY)
/// cannot be reached, since the kernel refuses a soft limit beyond it. None where unreadable.
pub fn somaxconn() -> Option<u64> {
    // (per network namespace: the value that caps this rank's listener)
    std::fs::read_to_string("/proc/sys/net/core/somaxconn").ok()?.trim().parse().ok()
}

/// fs.nr_open: the most any process's open-file limit can be.
pub fn nr_open() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open").ok()?.trim().parse().ok()
}

/// Descriptors this process has open now, not counting the one used to list them.
pub fn open_fds() -> Result<u64> {
    let dir = std::fs::read_dir("/proc/self/fd").map_err(|_| Error::os("listing /proc/self/fd"))?;
    Ok((dir.count() as u64).saturating_sub(1))
}
