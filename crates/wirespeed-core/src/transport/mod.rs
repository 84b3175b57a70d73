//! Moving bytes to a peer without blocking. `tcp` is the event-driven multi-stream engine used
//! between hosts and by the NCCL plugin.
pub mod tcp;
