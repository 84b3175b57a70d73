//! wirespeed-core: the transport and collective algorithms shared by the Python bindings
//! (`wirespeed._native`) and the NCCL network plugin. No Python, CUDA or NCCL code here.
//!
//! Modules, bottom up: each uses only modules listed before it, and no two import each other
//! (docs/architecture.md draws them).
//! - vocabulary: `error`, `dtype`, `api` (what every group offers: `Buf`, `Kind`, the
//!   `Collectives` trait, a send in flight as `Pending`/`Ticket`), `plan` (which algorithm per
//!   size and layout, with the constants' sources);
//! - the machine: `sys` (Linux calls), `kernels` (`reduce`, the reduction kernels; `copy`, the
//!   copy kernels);
//! - transport: `transport` (the `Transport` trait; `transport::tcp`, the event-driven
//!   multi-stream TCP engine, also what the NCCL plugin wraps; `transport::sim`, the in-memory
//!   simulated network; `transport::iface`, which address to listen on);
//! - `config`: every knob the core takes from the environment (`Config`: the planner's `Tuning`,
//!   the engine's `NetConfig`, the rest), read in that one file, once, by the caller at the edge
//!   (the bindings, the plugin's init) and passed down; no other module reads the environment;
//! - one host: `shm` (`segment` layout, `comm` connect/waits/sync points/failure detection,
//!   `collectives` that read peers' buffers in place, `p2p` send/recv);
//! - algorithms: `algo` (ring, doubling, tree, direct: each written once over the trait);
//! - several hosts: `hosts` (ranks grouped by host: shm inside, TCP across, itself a
//!   `Transport`; `hosts::mesh`, the group's TCP connections; `hosts::hier`, the hierarchical
//!   all_reduce; `hosts::fds`, the open-file budget that sets the streams per pair);
//! - on top: `group` (`Setup`: the one-host or the multi-host group, behind `Collectives`) and
//!   `engine` (ordered background execution), which the bindings call.
pub mod algo;
pub mod api;
pub mod config;
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
pub use config::Config;
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
