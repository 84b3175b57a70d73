use std::process::Command;

fn main() {
    // NCCL dlcloses a net plugin when its last communicator is destroyed, while the engine's I/O
    // threads may still be parked in epoll inside this library's code. `-z nodelete` keeps the
    // library mapped after dlclose (a later dlopen gets the same copy back), so those threads
    // never run in unmapped memory.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");

    // The driver binary's C logger (src/bin/driver/logger.c), compiled with the C compiler Rust already
    // links with on Linux; linked into the binaries only, never into the plugin.
    println!("cargo:rerun-if-changed=src/bin/driver/logger.c");
    let out = std::env::var("OUT_DIR").unwrap();
    let obj = format!("{out}/driver_logger.o");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc).args(["-c", "-O2", "-fPIC", "src/bin/driver/logger.c", "-o", &obj]).status();
    match status {
        Ok(s) if s.success() => println!("cargo:rustc-link-arg-bins={obj}"),
        other => panic!("compiling src/bin/driver/logger.c with `{cc}` failed ({other:?}): install a C compiler (cc)"),
    }
}
