// NCCL dlcloses a net plugin when its last communicator is destroyed, while the engine's I/O
// threads may still be parked in epoll inside this library's code. `-z nodelete` keeps the library
// mapped after dlclose (a later dlopen gets the same copy back), so those threads never run in
// unmapped memory.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
