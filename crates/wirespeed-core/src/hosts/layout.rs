//! Where the ranks are: ranks grouped by host, and the TCP streams each pair of ranks gets
//! (mod.rs's opening says why).
use std::sync::Arc;

/// Ranks grouped by host, hosts ordered by their lowest rank (so every rank computes the same).
pub struct HostLayout {
    /// Shared, so an algorithm that runs over the group's route can hold the layout while it
    /// borrows the route (group.rs clones it per call: a count, not 8,192 ranks' worth of
    /// vectors at 1,024 hosts x 8).
    pub hosts: Arc<[Vec<usize>]>,
    pub host_of: Vec<usize>,
    pub local_of: Vec<usize>,
}

impl HostLayout {
    pub fn new(ids: &[String]) -> HostLayout {
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut names: Vec<&String> = Vec::new();
        let mut host_of = vec![0; ids.len()];
        let mut local_of = vec![0; ids.len()];
        for (r, id) in ids.iter().enumerate() {
            let h = match names.iter().position(|n| *n == id) {
                Some(h) => h,
                None => {
                    names.push(id);
                    hosts.push(Vec::new());
                    hosts.len() - 1
                }
            };
            host_of[r] = h;
            local_of[r] = hosts[h].len();
            hosts[h].push(r);
        }
        HostLayout { hosts: hosts.into(), host_of, local_of }
    }

    /// TCP streams between ranks `a` and `b` (0 on one host): see the module's opening.
    pub fn pair_streams(&self, a: usize, b: usize, nstreams: usize) -> usize {
        let world = self.host_of.len();
        if self.host_of[a] == self.host_of[b] {
            0
        } else if self.local_of[a] == self.local_of[b] || (a + 1) % world == b || (b + 1) % world == a {
            nstreams
        } else {
            1
        }
    }
}
