//! wirespeed-core: the transport and collective algorithms shared by the Python bindings
//! (`wirespeed._native`) and the NCCL network plugin. No Python, CUDA or NCCL code here.
//!
//! Layers, bottom up (docs/architecture.md draws them):
//! - transport: `transport` (the `Transport` trait; `transport::tcp`, the event-driven
//!   multi-stream TCP engine; `transport::sim`, the in-memory simulated network), the one-host
//!   shared-memory transport (`sys` Linux calls, `segment` layout, `comm` connect/waits/sync
//!   points/failure detection, `p2p` send/recv), `iface` (which address to listen on);
//! - algorithms: `algo` (ring, doubling, tree, direct: each written once over the trait), the
//!   one-host shared-memory collectives that read peers' buffers in place (`collectives`), and
//!   the hierarchical all_reduce (`hier`);
//! - planner: `plan` (which algorithm per size and layout, with the constants' sources);
//! - groups: `tcp` (a group's TCP connections), `hosts` (ranks grouped by host: shm inside, TCP
//!   across, itself a `Transport`), `group` (one interface over both kinds of group), `engine`
//!   (ordered background execution), which the bindings call.
pub mod algo;
pub mod api;
pub mod plan;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod group;
pub mod hosts;
pub mod kernels;
pub mod shm;
pub mod sys;
pub mod transport;

pub use shm::comm::{Comm, RankInfo};
/// `transport::iface` under its old path: the NCCL plugin imports `wirespeed_core::iface`.
pub use transport::iface;
pub use dtype::{DType, ReduceOp};
pub use engine::{Engine, Op};
pub use api::Collectives;
pub use group::Setup;
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
