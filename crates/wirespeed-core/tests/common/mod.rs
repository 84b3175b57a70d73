//! What the integration tests that run ranks as threads share: starting the ranks of a group,
//! one thread each, and their inputs. Each test file is its own crate and uses part of this.
#![allow(dead_code)]
use std::time::Duration;
use wirespeed_core::FdRoom;
use wirespeed_core::testing::hosts;
use wirespeed_core::RankInfo;
use wirespeed_core::{Collectives, testing::Comm, Config, Setup, SetupReport};

/// Run `f(rank, group)` on a thread per group; results in rank order. A panic on any rank
/// fails the test.
fn on_threads<G: Send + 'static, T: Send + 'static>(groups: Vec<G>, f: impl Fn(usize, G) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = std::sync::Arc::new(f);
    let hs: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(r, g)| {
            let f = f.clone();
            std::thread::spawn(move || f(r, g))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Run `f(comm)` on `world` connected one-host ranks, one thread each; results in rank order.
pub fn with_ranks<T: Send + 'static>(world: usize, f: impl Fn(&mut Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    with_ranks_timeout(world, Duration::from_secs(20), f)
}

/// `with_ranks` with the group's timeout given (short ones test what follows a timeout).
pub fn with_ranks_timeout<T: Send + 'static>(world: usize, timeout: Duration, f: impl Fn(&mut Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    wirespeed_core::testing::one_host(world, timeout, &Config::default(), move |mut c| f(&mut c))
}

/// The ranks' configuration: the defaults, listening on loopback.
pub fn config() -> Config {
    Config::from_vars(&|v| (v == "WIRESPEED_IFNAME").then(|| "lo".to_string())).unwrap()
}

/// One multi-host setup per rank of the layout `ids` (one host id per rank), all of one job.
pub fn setups(ids: &[&str], timeout: Duration) -> Vec<hosts::Setup> {
    setups_with_rooms(ids, &[], timeout)
}

/// `setups`, each rank handed every rank's open-file room (hosts/fds.rs) as the bindings hand
/// them; empty: none, WIRESPEED_NSTREAMS as it is.
pub fn setups_with_rooms(ids: &[&str], rooms: &[FdRoom], timeout: Duration) -> Vec<hosts::Setup> {
    let token = wirespeed_core::random_token().unwrap();
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let cfg = config();
    (0..ids.len()).map(|r| hosts::Setup::new(r, ids.len(), token, timeout, &ids, rooms, &cfg).unwrap()).collect()
}

/// `with_hosts` with every rank's open-file room handed to its setup (`setups_with_rooms`).
pub fn with_hosts_rooms<T: Send + 'static>(ids: &[&str], rooms: &[FdRoom], f: impl Fn(&mut hosts::Group) -> T + Send + Sync + 'static) -> Vec<T> {
    let s = setups_with_rooms(ids, rooms, Duration::from_secs(20));
    let infos: Vec<RankInfo> = s.iter().map(|x| x.info()).collect();
    on_threads(s, move |_, x| f(&mut x.connect(&infos).unwrap()))
}

/// Run `f` on every rank of the layout `ids` (one host id per rank); results in rank order.
pub fn with_hosts<T: Send + 'static>(ids: &[&str], f: impl Fn(&mut hosts::Group) -> T + Send + Sync + 'static) -> Vec<T> {
    let s = setups(ids, Duration::from_secs(20));
    let infos: Vec<RankInfo> = s.iter().map(|x| x.info()).collect();
    on_threads(s, move |_, x| f(&mut x.connect(&infos).unwrap()))
}

/// Rank `rank`'s input of `n` elements: small values, different on every rank and element.
pub fn input(rank: usize, n: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 7 + rank * 13) % 101) as i64 - 50).collect()
}

/// Run `f` on every rank of the layout `ids`, each handed the group `Setup` makes for it (the
/// one-host group when all ids are equal, else the multi-host one) and its setup's report, as
/// the bindings get them.
pub fn with_groups<T: Send + 'static>(ids: &[&str], timeout: Duration, f: impl Fn(Box<dyn Collectives>, SetupReport) -> T + Send + Sync + 'static) -> Vec<T> {
    let token = wirespeed_core::random_token().unwrap();
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let cfg = config();
    let s: Vec<Setup> = (0..ids.len()).map(|r| Setup::new(r, ids.len(), token, timeout, &ids, &[], &cfg).unwrap()).collect();
    let infos: Vec<RankInfo> = s.iter().map(|x| x.info()).collect();
    on_threads(s, move |_, x| {
        let (g, report) = x.connect(&infos).unwrap();
        f(g, report)
    })
}
