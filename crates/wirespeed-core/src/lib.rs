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
//! - several hosts: `hosts` (ranks grouped by host: shm inside, TCP across; `hosts::route`, the
//!   group's one `Transport`, which its algorithms run over; `hosts::mesh`, the group's TCP
//!   connections; `hosts::hier`, the hierarchical all_reduce; `hosts::probe`, the streams per
//!   peer; `hosts::fds`, the open-file budget that sets the streams per pair);
//! - on top: `group` (`Setup`: the one-host or the multi-host group, behind `Collectives`, and
//!   its `SetupReport`) and `engine` (ordered background execution), which the bindings call.
//!
//! Every module is private: the bindings reach the re-exports below and `net`; the tests and
//! examples also `testing` (feature `testing`).
// Without `testing`, what only the tests reach (the simulated network, a few accessors) looks
// unused; the test builds turn `testing` on and check dead code over the whole surface.
#![cfg_attr(not(feature = "testing"), allow(dead_code))]

mod algo;
mod api;
mod config;
mod dtype;
mod engine;
mod error;
mod group;
mod hosts;
mod kernels;
mod plan;
mod shm;
mod sys;
mod transport;

// The front door: what the Python bindings use. Everything else is private to the core.
pub use api::{Buf, Collectives, RankInfo, Ticket};
pub use config::{host_id_from_env, host_id_from_knobs, knobs_over_env, Config};
pub use dtype::{check as check_reduction, DType, ReduceOp};
pub use engine::{Engine, Op, Owner};
pub use error::{Error, Result};
pub use group::{Setup, SetupReport};
pub use hosts::fds::FdRoom;
pub use hosts::probe::StreamChoice;
pub use sys::random_token;

/// The TCP engine and what the NCCL plugin (crates/wirespeed-nccl) needs around it: which
/// address to listen on, the engine's knobs from the environment, random keys.
pub mod net {
    pub use crate::config::{env, net as config, NetConfig};
    pub use crate::sys::random_bytes;
    pub use crate::transport::iface;
    pub use crate::transport::tcp::{Conn, Dialer, Listener, Reactor, Refusal, Report, Request, Told, Vet};
}

/// The core's insides that its integration tests, examples and benchmarks reach (feature
/// `testing`, which the crate's own dev-dependency turns on): the algorithms, the simulated
/// network, the groups themselves, the kernels. No binding may use them.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::algo::{direct, doubling, leaders, leaders_a2a, leaders_gs, ring, tree};
    pub use crate::dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
    pub use crate::hosts::{fds, HostLayout};
    /// The multi-host group and its setup.
    pub mod hosts {
        pub use crate::hosts::{Group, Setup};
    }
    pub use crate::kernels::{copy, reduce::reduce_many};
    pub use crate::plan::{NetAlgo, GATHER_RING_MIN};
    pub use crate::shm::comm::Comm;
    pub use crate::shm::threads::one_host;
    /// The Linux calls the examples time (a peer's memory read with process_vm_readv).
    pub mod sys {
        pub use crate::sys::{getpid, random_token, read_peer};
    }
    pub use crate::transport::{sim, Handle, Transport};
}

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
