//! wirespeed-core: the transport and collective algorithms shared by the Python bindings
//! (`wirespeed._native`) and the NCCL network plugin. No Python, CUDA or NCCL code here.
//!
//! Layers, bottom up: `sys` (Linux calls), `segment` (shared-memory layout), `comm` (connect,
//! waits, sync points, failure detection), `collectives` and `p2p` (the operations), `algo`
//! (which algorithm per size), `engine` (ordered background execution). Across hosts: `iface`
//! (which address to listen on), `tcp` (multi-stream connections with a handshake), `hosts` (ranks
//! grouped by host; shm inside, TCP across), `ring` (ring and hierarchical all_reduce), and
//! `group` (one interface over both kinds of group).
pub mod algo;
pub mod plan;
pub mod collectives;
pub mod comm;
pub mod dtype;
pub mod doubling;
pub mod engine;
pub mod error;
pub mod group;
pub mod hier;
pub mod hosts;
pub mod iface;
pub mod p2p;
pub mod reduce;
pub mod ring;
pub mod segment;
pub mod sys;
pub mod tcp;
pub mod transport;

pub use comm::{Comm, RankInfo};
pub use dtype::{DType, ReduceOp};
pub use engine::{Engine, Op};
pub use group::{Collectives, Setup};
pub use error::{Error, Result};

/// Version of the core, reported by `wirespeed env` so a bug report names the native build.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_is_the_crate_version() {
        assert_eq!(super::version(), env!("CARGO_PKG_VERSION"));
    }
}
