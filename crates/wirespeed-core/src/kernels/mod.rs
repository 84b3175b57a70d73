//! The kernels that touch every byte: reductions (`reduce`) and copies (`copy`).
pub mod copy;
pub mod reduce;
