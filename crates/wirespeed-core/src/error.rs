//! One error type for every operation of the core. Each variant is a distinct failure a user can
//! meet, so the bindings can raise a distinct exception for each.
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// A peer process exited (or was killed) while this rank depended on it.
    PeerDied { rank: usize, pid: i32 },
    /// A peer raised an error of its own and aborted the group; its message is attached.
    PeerAborted { rank: usize, reason: String },
    /// A connection to a peer that is not a rank of a group (the NCCL plugin's) broke.
    PeerLost(String),
    /// Nothing happened for `timeout` seconds while waiting for `what`.
    Timeout { what: String, secs: f64 },
    /// Ranks called the same collective with different sizes, dtypes, ops, roots or kinds.
    Mismatch(String),
    /// The request cannot be served by this backend (the message names what is supported).
    Unsupported(String),
    /// A handshake from a process of another job, or a segment that is not ours.
    Stranger(String),
    /// The group was broken by an earlier error; it has to be recreated.
    Broken(String),
    /// An operating-system call failed.
    Os { call: &'static str, errno: i32 },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn os(call: &'static str) -> Error {
        Error::Os { call, errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0) }
    }

    /// A caught panic (a bug of ours) as the error of the op it interrupted.
    pub(crate) fn from_panic(p: Box<dyn std::any::Any + Send>) -> Error {
        let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
        Error::Broken(format!("internal error in wirespeed ({why}); please report it"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::PeerDied { rank, pid } => write!(f, "peer rank {rank} (pid {pid}) died"),
            Error::PeerAborted { rank, reason } => write!(f, "peer rank {rank} failed: {reason}"),
            Error::PeerLost(m) => write!(f, "{m}"),
            Error::Timeout { what, secs } => write!(f, "timed out after {secs:.1} s waiting for {what}"),
            Error::Mismatch(m) => write!(f, "ranks disagree: {m}"),
            Error::Unsupported(m) => write!(f, "{m}"),
            Error::Stranger(m) => write!(f, "refused: {m}"),
            Error::Broken(m) => write!(f, "the wirespeed group is broken by an earlier error ({m}); create a new one"),
            Error::Os { call, errno } => {
                write!(f, "{call} failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl std::error::Error for Error {}
