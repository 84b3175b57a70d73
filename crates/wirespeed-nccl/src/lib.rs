//! wirespeed-net: an NCCL network plugin that fills plain-TCP links.
//!
//! NCCL's socket transport moves a peer's traffic over a few TCP connections with a static split,
//! so on networks that cap each flow (clouds, shaped links) most of the link stays idle. This
//! library plugs wirespeed-core's multi-stream TCP engine into NCCL instead: every NCCL connection
//! becomes `WIRESPEED_NSTREAMS` TCP streams (from API v11 on, its share of them when NCCL's
//! `setNetAttr` says it drives several connections at once) that pull each message's chunks from
//! one queue as fast as their flows drain, so a slow flow gets less work rather than holding the
//! others back.
//!
//! Built as `libnccl-net-wirespeed.so` (see `make plugin`); NCCL loads it with
//! `NCCL_NET_PLUGIN=wirespeed` (or the library's path) and logs "Using network wirespeed".
//! Modules: `abi` (the C structs of API v8..v12), `ffi` (the exported tables, one thin adapter per
//! version, no panic crosses them), `plugin` (the one implementation), `handle` (what NCCL carries
//! between ranks), `config` (knobs and interfaces), `log` (NCCL's logger). docs/plugin.md has the
//! user's side.
pub mod abi;
pub mod config;
pub mod ffi;
pub mod handle;
pub mod log;
pub mod plugin;
