//! Requests: a posted send or receive, and how a caller waits for it.
use super::stream::{ConnInner, ReqState};
use super::WAIT_SLICE;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A send or receive in flight. Dropping it does not cancel it: the buffer must stay alive until
/// it completes or its connection is closed.
pub struct Request {
    pub(super) st: Arc<ReqState>,
    pub(super) conn: Arc<ConnInner>,
}

impl Request {
    /// `Some(bytes)` once complete (bytes sent, or bytes received into the posted buffer);
    /// `None` while in flight; the connection's error if it failed.
    pub fn test(&self) -> Result<Option<usize>> {
        if !self.st.done.load(Acquire) {
            self.conn.progress();
        }
        self.outcome()
    }

    fn outcome(&self) -> Result<Option<usize>> {
        if !self.st.done.load(Acquire) {
            return Ok(None);
        }
        if let Some(e) = self.st.error.lock().unwrap().clone() {
            return Err(e);
        }
        Ok(Some(self.st.bytes.load(Acquire)))
    }

    /// Whether the request's connection has its streams (a pending one may not yet).
    pub fn is_connected(&self) -> bool {
        self.conn.attached()
    }

    pub fn is_done(&self) -> bool {
        self.st.done.load(Acquire)
    }

    /// Wait until complete: move bytes in this thread for the configured spin, then sleep in
    /// slices. `what` names the wait in a timeout error.
    pub fn wait_for(&self, timeout: Duration, what: &dyn Fn() -> String) -> Result<usize> {
        let start = Instant::now();
        let c = &*self.conn;
        while start.elapsed() < c.spin {
            if let Some(n) = self.outcome()? {
                return Ok(n);
            }
            c.progress();
            std::hint::spin_loop();
        }
        loop {
            if let Some(n) = self.outcome()? {
                return Ok(n);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout { what: what(), secs: timeout.as_secs_f64() });
            }
            c.progress();
            c.sleepers.fetch_add(1, SeqCst);
            {
                let g = c.wake_lock.lock().unwrap();
                if !self.st.done.load(SeqCst) {
                    let _ = c.wake.wait_timeout(g, left.min(WAIT_SLICE)).unwrap();
                }
            }
            c.sleepers.fetch_sub(1, SeqCst);
        }
    }

    pub fn wait(&self, timeout: Duration) -> Result<usize> {
        let peer = self.conn.peer_name();
        self.wait_for(timeout, &|| format!("a message to or from {peer}"))
    }
}
