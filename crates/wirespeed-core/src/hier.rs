//! Hierarchical all_reduce, the default across hosts: shm reduce onto each host's leader (its
//! lowest rank), an all_reduce among the leaders over TCP, shm broadcast from the leader. Each
//! host's link carries the buffer about twice whatever the number of ranks per host, where a flat
//! ring over ranks placed round robin sends every hop over a link.
//!
//! Among the leaders the cost model (algo.rs) picks the ring (ring.rs: 2(H-1) messages, each link
//! carries 2·S·(H-1)/H each way) or, for small messages and a power-of-two number of hosts,
//! recursive doubling (doubling.rs: log2(H) messages of the whole buffer).
use crate::plan::AllReduceAlgo;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::hosts::HostsComm;

impl HostsComm {
    pub(crate) fn hier_all_reduce(&mut self, tag: u64, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        // avg: sum inside hosts; the leaders' all_reduce divides by the whole world once.
        let local_op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let nlocal = self.hosts()[self.my_host()].len();
        if nlocal > 1 {
            self.local.reduce(buf, count, dtype, local_op, 0)?;
        }
        if self.is_leader() {
            let leaders: Vec<usize> = self.hosts().iter().map(|h| h[0]).collect();
            match self.tuning.pick_among_leaders(count * dtype.size(), leaders.len()) {
                AllReduceAlgo::Doubling => self.doubling_all_reduce(tag, &leaders, buf, count, dtype, op)?,
                _ => self.ring_all_reduce(tag, &leaders, buf, count, dtype, op)?,
            }
        }
        if nlocal > 1 {
            self.local.broadcast((buf, count * dtype.size()), 0)?;
        }
        Ok(())
    }
}
