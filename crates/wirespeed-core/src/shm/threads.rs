//! One-host groups whose ranks are threads of this process: what the core's tests, its
//! integration tests and its examples start ranks with (`testing::one_host`).
use super::comm::Comm;
use crate::config::Config;
use std::sync::Arc;
use std::time::Duration;

/// Run `f(comm)` on `world` connected one-host ranks with `cfg` and `timeout`, one thread each;
/// results in rank order. A panic on any rank fails the caller.
pub fn one_host<T: Send + 'static>(world: usize, timeout: Duration, cfg: &Config, f: impl Fn(Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    let token = crate::sys::random_token().unwrap();
    let comms: Vec<Comm> = (0..world).map(|r| Comm::new(r, world, token, timeout, cfg).unwrap()).collect();
    let infos: Vec<_> = comms.iter().map(|c| c.info()).collect();
    let f = Arc::new(f);
    let hs: Vec<_> = comms
        .into_iter()
        .map(|mut c| {
            let (infos, f) = (infos.clone(), f.clone());
            std::thread::spawn(move || {
                c.connect(&infos).unwrap();
                f(c)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}
