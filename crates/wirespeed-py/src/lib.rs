//! `wirespeed._native`: thin pyo3 bindings over wirespeed-core. Logic lives in the core; this crate
//! only converts types and releases the GIL around anything that waits.
use pyo3::prelude::*;

/// Version of the native core this module was built from.
#[pyfunction]
fn core_version() -> &'static str {
    wirespeed_core::version()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(core_version, m)?)?;
    Ok(())
}
