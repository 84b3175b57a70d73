//! A group as the engine sees it: one set of collectives (`api::Collectives`), whatever carries
//! them; this file makes the group (`Setup`), and each group implements the trait itself. Ranks
//! that all share a host get the shared-memory `Comm` unchanged (its speed is the product on one
//! host); ranks spread over hosts get `hosts::Group`, which uses a `Comm` per host plus TCP between
//! hosts.
//!
//! Setup is two steps so any store can carry the rendezvous: `Setup::new` (knowing every rank's
//! host id) creates what peers need to reach this rank and returns it from `info`; the caller
//! exchanges infos through its store and hands them all to `connect`.
use crate::api::Collectives;
use crate::config::Config;
use crate::api::RankInfo;
use crate::shm::comm::Comm;
use crate::error::Result;
use crate::hosts::fds::FdRoom;
use crate::hosts::probe::StreamChoice;
use crate::hosts;
use std::time::Duration;

/// A rank between `new` and `connect`.
// Unboxed though the variants differ by hundreds of bytes: a rank makes one, once.
#[allow(clippy::large_enum_variant)]
pub enum Setup {
    OneHost(Comm),
    Hosts(hosts::Setup),
}

impl Setup {
    /// `hosts[r]` is rank r's host id (`Config::host_id`); `rooms[r]` its open-file room
    /// (`FdRoom::here`, published with the host id; empty: unchecked), which a group across hosts
    /// budgets its sockets with (hosts/fds.rs); `cfg` is the core's configuration, read once by
    /// the caller (`Config::from_env` in the bindings).
    pub fn new(rank: usize, world: usize, token: [u8; 16], timeout: Duration, hosts: &[String], rooms: &[FdRoom], cfg: &Config) -> Result<Setup> {
        if hosts.is_empty() || hosts.iter().all(|h| *h == hosts[0]) {
            return Ok(Setup::OneHost(Comm::new(rank, world, token, timeout, cfg)?));
        }
        Ok(Setup::Hosts(hosts::Setup::new(rank, world, token, timeout, hosts, rooms, cfg)?))
    }

    pub fn info(&self) -> RankInfo {
        match self {
            Setup::OneHost(c) => c.info(),
            Setup::Hosts(h) => h.info(),
        }
    }

    /// The connected group, and what its setup chose (`SetupReport`).
    pub fn connect(self, infos: &[RankInfo]) -> Result<(Box<dyn Collectives>, SetupReport)> {
        match self {
            Setup::OneHost(mut c) => {
                c.connect(infos)?;
                Ok((Box::new(c), SetupReport::default()))
            }
            Setup::Hosts(h) => {
                let g = h.connect(infos)?;
                let report = SetupReport { streams: Some(g.stream_choice().clone()) };
                Ok((Box::new(g), report))
            }
        }
    }
}

/// What a group's setup chose, the same on every rank: for the callers to show (the bindings
/// compose the lines), not for the ops.
#[derive(Clone, Debug, Default)]
pub struct SetupReport {
    /// Across hosts, the TCP streams per peer and what chose them (hosts/probe.rs); None on one
    /// host.
    pub streams: Option<StreamChoice>,
}
