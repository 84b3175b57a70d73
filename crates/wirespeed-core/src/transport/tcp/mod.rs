//! The event-driven multi-stream TCP engine: what the collective groups use between hosts and what
//! the NCCL network plugin (crates/wirespeed-nccl) exposes to NCCL. One engine, two clients.
//!
//! Shape. A `Conn` joins this process to one peer through `nstreams` TCP connections (streams).
//! Both directions carry messages, and messages in each direction are matched in posting order:
//! the n-th `isend` on one side fills the n-th `irecv` on the other. Nothing blocks: `isend` and
//! `irecv` return a `Request` that completes later; `Request::test` polls, `Request::wait` waits.
//! The I/O is driven by a `Reactor`: a small fixed number of threads per process, each running an
//! epoll loop (mio) over the sockets assigned to it, never a thread per stream. The threads that
//! post and wait also move bytes when they can (see Progress below), so a small message does not
//! pay two thread hand-offs.
//!
//! Framing. A message is cut into chunks; each chunk travels with a 40-byte header (magic, chunk
//! length, message sequence number, tag, message length, offset). The chunk size is the message
//! over the streams, between `MIN_SPLIT` and `chunk`: a 1 MiB message spreads over 8 streams in
//! 128 KiB chunks, a 64 MiB one goes in `chunk`-sized pieces, a 4 KiB one is a single chunk.
//!
//! Streams pull chunks. The chunks of every send wait in one queue per connection, in posting
//! order; a stream takes the next one only when it has finished writing its current one, and the
//! kernel takes only `notsent_lowat` bytes beyond what is on the wire (TCP_NOTSENT_LOWAT), so a
//! stream's share is what its flow really carries. Why: flows are not equal. A per-flow cap
//! shared by two flows whose ports hash alike, or one flow that lost a packet, runs at half speed;
//! when chunks were pushed to streams at posting time the kernel's multi-megabyte socket buffers
//! hid that, the slow stream got as many chunks as the fast ones, and every message waited for its
//! last chunk on the slow one (a 2-host all_reduce fell from 0.83 to 0.44-0.53 of the link). A
//! stream pulls in queue order, so its chunks of message k precede its chunks of message k+1.
//!
//! Receiving. Each stream's reader reads a header, finds the posted receive with that sequence
//! number, checks the tag and that the message fits the posted buffer (a larger message is an
//! error, never an overflow), and reads the body straight into the destination at the chunk's
//! offset. A header for a message whose receive is not posted yet parks the stream: its bytes stay
//! in the kernel's socket buffer (TCP flow control slows the sender) until `irecv` posts that
//! message, which resumes the stream. A request completes when all its bytes have moved.
//!
//! Progress. Sockets are edge-triggered. A reactor thread that gets an event takes the stream's
//! lock (blocking) and reads or writes until the socket would block, so no event is ever lost.
//! Callers only ever try the lock: `isend` writes what fits right away, `irecv` resumes parked
//! streams, and `Request::wait` reads and writes while it spins. Whoever holds a stream's lock
//! drains it to would-block before letting go.
//!
//! Handshake. A dialer opens the streams and sends on each a 48-byte hello: magic, a 32-byte key
//! (opaque to the engine: the collective groups put the job token and both ranks in it, the NCCL
//! plugin a random nonce from its handle), the stream index and the stream count. The listener's
//! reactor reads hellos in the background, asks the listener's vetting function about the key
//! (a stranger is refused, logged and counted, and never reaches a `Conn`), answers with the hello
//! echoed, and groups streams by key until a connection is complete. With a job secret
//! (WIRESPEED_JOB_SECRET, `NetConfig::secret`) both sides also prove they know it, each by a MAC
//! over the other's fresh nonce (auth.rs), before a stream joins a connection: the key alone,
//! which the store gives away, no longer gets anyone in. A silent connection is
//! dropped after `HELLO_TIMEOUT`, and at most `MAX_PENDING` may wait at once.
//!
//! Failure. End of file or a reset on any stream, or a malformed frame, fails the whole
//! connection: every pending request then returns the error. `close` shuts the sockets and takes
//! every stream's lock once, so when it returns no engine thread touches a caller's buffer again.
use std::time::Duration;

mod auth;
mod conn;
pub mod dial;
mod dialer;
mod handshake;
mod reactor;
mod request;
mod stream;
#[cfg(test)]
mod tests;

pub use auth::Secret;
pub use conn::{Attacher, Conn};
pub use dialer::Dialer;
pub use handshake::{Listener, Refusal, Report, Handoff, Told, Vet};
pub use reactor::Reactor;
pub use request::Request;

const HELLO_MAGIC: u64 = 0x5753_4e45_5448_0002; // "WSNETH" v2
/// A hello that proves the job secret follows (auth.rs): the hello, then the dialer's nonce.
const HELLO_MAGIC_AUTH: u64 = 0x5753_4e45_5448_0003;
const HELLO_LEN: usize = 48;
const HELLO_AUTH_LEN: usize = HELLO_LEN + auth::NONCE_LEN;
/// What a listener sends once a dialer's proof holds: the stream is accepted.
const AUTH_ACK: [u8; 8] = *b"WSAUTHOK";
/// A listener's final refusal (handshake.rs `Told`): these 7 bytes, then the reason's code.
const REFUSED_PREFIX: [u8; 7] = *b"WSREFUS";
const FRAME_MAGIC: u32 = 0x5753_4652; // "WSFR"
/// A frame header that says why its sender broke its group (stream.rs `tell_abort`): the reason's
/// length where a data frame has its own, then the reason; the last frame on its stream.
const ABORT_MAGIC: u32 = 0x5753_4142; // "WSAB"
/// The longest reason an abort frame carries (a longer one is cut).
const ABORT_MAX: usize = 1024;
const FRAME_LEN: usize = 40;
/// Smallest chunk a message is split into: below this, a header and a system call per chunk cost
/// more than a second stream gains.
const MIN_SPLIT: usize = 32 << 10;
/// How long an accepted connection may take to say who it is.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections that may wait for their hello (or for their sibling streams) at once.
const MAX_PENDING: usize = 1024;
/// Longest a reactor thread sleeps in epoll: how often handshake deadlines are checked.
const REACTOR_TICK: Duration = Duration::from_millis(100);
/// Longest single sleep of a waiting caller: how often it checks its deadline.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// The engine's knobs, given to `Reactor::new`, `Listener::bind_vetted` and `Dialer::start`.
/// config.rs reads them from the environment (`config::net`), once, where the engine is started
/// (a multi-host group's `Config`, the NCCL plugin's init); the engine itself reads no variable.
#[derive(Clone, Copy, Debug)]
pub struct NetConfig {
    /// TCP connections per peer (WIRESPEED_NSTREAMS).
    pub nstreams: usize,
    /// Largest chunk a message is cut into (WIRESPEED_CHUNK_BYTES).
    pub chunk: usize,
    /// Reactor threads per process (WIRESPEED_IO_THREADS).
    pub io_threads: usize,
    /// SO_SNDBUF/SO_RCVBUF for every stream; 0 leaves the kernel's autotuning alone (WIRESPEED_SOCKBUF).
    pub sockbuf: usize,
    /// How long a waiting caller moves bytes itself before it sleeps (WIRESPEED_NET_SPIN_US).
    pub spin: Duration,
    /// TCP_NOTSENT_LOWAT for every stream: unsent bytes the kernel holds beyond what is on the
    /// wire; 0 leaves the kernel's default (WIRESPEED_NOTSENT_LOWAT).
    pub notsent_lowat: usize,
    /// The job secret both ends of every connection must prove (WIRESPEED_JOB_SECRET); None:
    /// the key alone admits (auth.rs says what that does not protect).
    pub secret: Option<Secret>,
    /// A group's lazy connections (hosts/mesh.rs): the least bytes of a message that opens all of
    /// a pair's streams, where the pair starts with one (WIRESPEED_GROW_BYTES; 0: all at first
    /// use). None: `grow_at`'s default. The NCCL plugin opens all at once and ignores it.
    pub grow_bytes: Option<usize>,
}

/// The least bytes of a message that open all `cap` streams of a group's pair (`grow` where set,
/// 0 meaning at once). By default, the message that `cap` streams would carry as one chunk each
/// (`MIN_SPLIT` x `cap`: 384 KiB at 12): a smaller one is cut into fewer chunks than there are
/// streams, so the streams past its chunks would not carry it anyway. A pair that only ever
/// carries smaller messages (the host leaders' small collectives, algo/leaders*.rs) keeps one
/// stream, so a leader's partners cost it one socket each (docs/scale.md); one that carries a
/// bandwidth collective's pieces gets them all.
pub fn grow_at(grow: Option<usize>, cap: usize) -> usize {
    if cap <= 1 {
        return 0;
    }
    grow.unwrap_or(MIN_SPLIT * cap)
}

impl Default for NetConfig {
    /// Defaults (the measurements behind them are in docs/transport.md):
    /// - 12 streams: clouds and the emulated cluster cap each flow (e.g. 250 Mbit/s flows on a
    ///   2 Gbit/s link). 8 such flows can carry at most 0.89 of that link (TCP's headers, and htb
    ///   never quite gives every class its full share), 10-12 carry 0.94; the all_reduce reached
    ///   0.83-0.86 with 8 and 0.88-0.89 with 12. The price: on a link one flow fills, flows
    ///   share one queue and 12 gave 0.86-0.88 where 4 gave 0.94; so a multi-host group sends
    ///   on only as many as a probe at setup finds useful (hosts/probe.rs: 2 there), unless
    ///   WIRESPEED_NSTREAMS is set. CPU-bound on a 40 Gbit/s link, 12 cost nothing against 8
    ///   (docs/transport.md has the runs).
    /// - 512 KiB chunks: a header and a system call per chunk are noise, and a 4 MiB piece still
    ///   spreads over every stream.
    /// - 1 reactor thread up to 4 CPUs, 2 above: the callers move most bytes themselves, and a
    ///   second thread on a 2-core machine only competes with the ranks.
    /// - 50 us of spinning: a sleeping waiter's wake-up costs ~30 us here; spinning much longer
    ///   steals the core a peer rank on the same host needs.
    /// - 64 KiB of unsent bytes per stream (beyond what is in flight): enough to keep a
    ///   5 Gbit/s flow busy across a ~100 us wake-up, small enough that a half-speed flow holds
    ///   back little (see "Streams pull chunks" above); 64 KiB gave 0.88-0.89 of the capped
    ///   link where 128 and 256 KiB gave 0.79-0.92.
    fn default() -> NetConfig {
        let cpus = crate::sys::cpus_available();
        NetConfig {
            nstreams: 12,
            chunk: 512 << 10,
            io_threads: if cpus > 4 { 2 } else { 1 },
            sockbuf: 0,
            spin: Duration::from_micros(50),
            notsent_lowat: 64 << 10,
            secret: None,
            grow_bytes: None,
        }
    }
}
