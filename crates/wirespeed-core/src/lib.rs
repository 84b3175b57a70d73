//! wirespeed-core: the transport and collective algorithms shared by the Python bindings
//! (`wirespeed._native`) and the NCCL network plugin. No Python, CUDA or NCCL code here.

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
