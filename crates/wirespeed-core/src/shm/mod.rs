//! Shared memory between the ranks of one host: the segment layout (`segment`), connect, waits,
//! sync points and failure detection (`comm`), the collectives that read peers' buffers in place
//! (`collectives`), and point-to-point send/recv (`p2p`).
pub mod collectives;
pub mod comm;
pub mod p2p;
pub mod segment;
#[cfg(any(test, feature = "testing"))]
pub mod threads;
