//! How many of the opened TCP streams a rank sends on to each bandwidth peer: measured once, at
//! setup, by a short probe between the first two hosts' leaders (rank 0 and the lowest rank of
//! the second host), and told to every rank.
//!
//! Why. Streams are there for links that cap each flow (clouds do: a 2 Gbit/s link whose flows
//! get 250 Mbit/s each needs 8 flows to fill, in practice 10-12). On a link that one flow fills,
//! the same 12 flows only share one queue and lose a few percent (0.92-0.95 of the link's TCP
//! ceiling against 0.95-0.97 with 2, benchmarks/README.md). No stream count serves both, and the
//! user cannot be asked to know which link they have.
//!
//! What the probe measures. Both ends send to each other at once (as an all_reduce loads the
//! link): first a little on every opened stream (so that no step times a stream's first bytes),
//! then steps on 1 stream, 2, 4, 8, ... up to the streams opened. A step is MSGS messages queued
//! at once each way, so streams pull chunks as their flows allow, as in a collective; rank 0
//! times it from announcing it to its last byte sent and received, and takes bytes over time as
//! the step's rate. The one-stream step is repeated with twice the bytes until it lasts
//! PHASE_MIN (so a fast link gets a long enough step), and later steps give each stream at least
//! STREAM_MIN (a flow that has idled needs a few round trips to get going), so no step is only
//! TCP's slow start. A step helps if it carries 30%
//! more than the best of fewer streams for twice the streams (the flows are still what limits);
//! growth stops after two steps in a row that did not help, at the streams opened, or after
//! BUDGET. The streams used are twice the most that helped (a capped link's flows do not all get
//! their full cap: 8 flows of 250 Mbit/s carried 0.83-0.86 of a 2 Gbit/s link, 12 carried
//! 0.88-0.89), at most the streams opened: 2 on a link one flow fills, all 12 on the capped
//! link above.
//!
//! Only the sender's count changes: every stream stays open and is read (a chunk's frame says
//! where its bytes go), so the receiving side need not know, and the open-file budget (fds.rs)
//! still counts the streams opened. WIRESPEED_NSTREAMS, set on rank 0, skips the probe: every
//! opened stream is used, as before. One pair's probe stands for every link: the network is
//! taken to cap flows alike everywhere (a cloud's per-flow limit is a property of the network).
use super::route::Route;
use crate::error::{Error, Result};
use crate::transport::Transport;
use std::time::{Duration, Instant};

/// The tags of the probe's messages (the first collective's tag has bit 63 set: never these).
const TAG_CTL: u64 = 0x5753_5052_4f42_4543; // "WSPROBEC"
const TAG_DATA: u64 = 0x5753_5052_4f42_4544; // "WSPROBED"
/// Shortest step: below it a step measures TCP's slow start and the timer's grain.
const PHASE_MIN: Duration = Duration::from_millis(6);
/// First bytes of the one-stream step (each stream of a later step carries what it settled on).
const FIRST: usize = 64 << 10;
/// Most bytes of one message of a step (so the probe's buffers stay small on a fast link).
const MOST: usize = 8 << 20;
/// What each stream carries before the steps (per message).
const WARM: usize = 64 << 10;
/// Least each stream carries per message in the steps past the first: a flow that has been
/// idle needs a few round trips to reach its rate, which a shorter step would time instead.
const STREAM_MIN: usize = 256 << 10;
/// No new step starts after this: a slow link's probe stays bounded.
const BUDGET: Duration = Duration::from_millis(250);
/// A step helps if its rate exceeds the best of fewer streams by this share of the added
/// streams' ideal gain (30% for twice the streams).
const GAIN: f64 = 0.3;

/// The streams chosen, and what chose them (the same on every rank).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamChoice {
    /// Streams opened to each bandwidth peer (WIRESPEED_NSTREAMS, or fewer where the open-file
    /// budget gave fewer).
    pub opened: usize,
    /// Streams each rank sends on to those peers.
    pub used: usize,
    /// WIRESPEED_NSTREAMS was set (on rank 0): no probe, every opened stream is used.
    pub forced: bool,
    /// The probe's steps: (streams, bytes per second each way); empty without a probe.
    pub steps: Vec<(usize, f64)>,
    /// How long the probe took, seconds.
    pub secs: f64,
}

impl StreamChoice {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut w: Vec<u64> = vec![self.opened as u64, self.used as u64, self.forced as u64, self.secs.to_bits(), self.steps.len() as u64];
        for &(k, r) in &self.steps {
            w.extend([k as u64, r.to_bits()]);
        }
        w.resize(ENCODED / 8, 0);
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    pub(super) fn decode(b: &[u8]) -> StreamChoice {
        let w: Vec<u64> = b.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let n = (w[4] as usize).min(MAX_STEPS);
        let steps = (0..n).map(|i| (w[5 + 2 * i] as usize, f64::from_bits(w[6 + 2 * i]))).collect();
        StreamChoice { opened: w[0] as usize, used: w[1] as usize, forced: w[2] != 0, secs: f64::from_bits(w[3]), steps }
    }
}

/// Steps fit (log2 of 64 streams, the most WIRESPEED_NSTREAMS allows, plus the last odd one).
const MAX_STEPS: usize = 8;
pub(super) const ENCODED: usize = 8 * (5 + 2 * MAX_STEPS);

/// The streams to use from the probe's steps (in the order run; the first is one stream) and
/// the streams opened: twice the most streams that still helped (`helps`, against the best rate
/// of fewer streams), within 1..=opened. Twice: flows sharing a link do not all get their cap
/// (htb, a switch's queue), and a spare flow costs little where one flow fills the link.
pub fn choose(steps: &[(usize, f64)], opened: usize) -> usize {
    let Some(&(k0, r0)) = steps.first() else { return opened };
    let (mut bk, mut br) = (k0, r0);
    for &(k, r) in &steps[1..] {
        if helps(bk, br, k, r) {
            (bk, br) = (k, r);
        }
    }
    (2 * bk).clamp(1, opened.max(1))
}

/// Whether the step to `k` streams at rate `r` helped over the best before it, `k0` streams at `r0`.
fn helps(k0: usize, r0: f64, k: usize, r: f64) -> bool {
    r >= r0 * (1.0 + GAIN * (k as f64 / k0 as f64 - 1.0))
}

/// The probe, on rank 0 (which leads it and returns its choice) and its partner, the first rank
/// of the second host; other ranks return None at once. `opened`: the bandwidth pairs' streams;
/// `forced`: WIRESPEED_NSTREAMS is set here (rank 0's decides). The group tells every rank the
/// choice.
pub(super) fn measure(c: &mut Route, opened: usize, forced: bool) -> Result<Option<StreamChoice>> {
    let partner = c.lay.hosts[1][0];
    if c.rank == 0 {
        return Ok(Some(lead(c, partner, opened, forced)?));
    } else if c.rank == partner {
        follow(c, 0)?;
    }
    Ok(None)
}

/// Messages per step, queued at once: a stream pulls its chunks from them as its flow allows,
/// as in a collective's traffic, rather than each stream carrying one chunk.
const MSGS: usize = 2;

/// One step, both ways at once: MSGS messages of `bytes` from `send` to `peer` and as many from
/// it into `recv`; bytes per second from `t` (before the step was announced: its latency counts
/// in every step alike) to the last byte, sent or received.
fn exchange(c: &mut Route, peer: usize, send: &[u8], recv: &mut [u8], bytes: usize, t: Instant) -> Result<f64> {
    let mut posted = Vec::with_capacity(2 * MSGS);
    for i in 0..MSGS {
        // SAFETY: both buffers are ours and outlive the waits below (which complete or fail
        // every request; a failure breaks the group, whose shutdown ends the engine's use of
        // them). Every send reads the same `bytes` of `send`; each receive has its own piece.
        unsafe {
            posted.push(c.mesh.post_send(peer, send.as_ptr(), bytes, TAG_DATA)?);
            posted.push(c.mesh.post_recv(peer, recv.as_mut_ptr().add(i * bytes), bytes, TAG_DATA)?);
        }
    }
    let mut got = Ok(());
    for h in posted {
        got = got.and(c.mesh.wait(h));
    }
    got?;
    Ok((MSGS * bytes) as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

fn send_ctl(c: &mut Route, peer: usize, k: usize, bytes: usize) -> Result<()> {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&(k as u64).to_le_bytes());
    m[8..].copy_from_slice(&(bytes as u64).to_le_bytes());
    // SAFETY: `m` outlives the wait.
    let h = unsafe { c.mesh.post_send(peer, m.as_ptr(), m.len(), TAG_CTL)? };
    c.mesh.wait(h)
}

/// Rank 0: run the steps, telling the partner each one (streams, bytes per message) before it,
/// and (0, 0) at the end.
fn lead(c: &mut Route, peer: usize, opened: usize, forced: bool) -> Result<StreamChoice> {
    let t0 = Instant::now();
    let mut steps: Vec<(usize, f64)> = Vec::new();
    if !forced && opened > 1 {
        let mut send = Vec::new();
        let mut recv = Vec::new();
        let mut step = |c: &mut Route, k: usize, bytes: usize| -> Result<f64> {
            if send.len() < bytes {
                send.resize(bytes, 0);
                recv.resize(MSGS * bytes, 0);
            }
            let t = Instant::now();
            send_ctl(c, peer, k, bytes)?;
            // A pair opens its streams as its messages need them (mesh.rs): the steps measure
            // all of them, made before the first step.
            c.mesh.open_all(peer)?;
            c.mesh.set_active(peer, k)?;
            exchange(c, peer, &send, &mut recv, bytes, t)
        };
        // First every stream carries a little (WARM each), so that no step below times a
        // stream's first bytes.
        step(c, opened, (WARM * opened).min(MOST))?;
        // One stream, with more bytes until the timed part is long enough to measure.
        let mut per = FIRST;
        let mut one = step(c, 1, per)?;
        while (MSGS * per) as f64 / one < PHASE_MIN.as_secs_f64() && per * 2 * opened <= MOST && t0.elapsed() < BUDGET {
            per *= 2;
            one = step(c, 1, per)?;
        }
        steps.push((1, one));
        // Twice as many streams each step, until two steps in a row did not help (one step
        // alone may read low) or every opened stream was tried.
        let (mut k, mut best, mut misses) = (1, (1, one), 0);
        while k < opened && misses < 2 && t0.elapsed() < BUDGET {
            k = (k * 2).min(opened);
            let r = step(c, k, (per.max(STREAM_MIN) * k).min(MOST))?;
            steps.push((k, r));
            if helps(best.0, best.1, k, r) {
                (best, misses) = ((k, r), 0);
            } else {
                misses += 1;
            }
        }
    }
    send_ctl(c, peer, 0, 0)?;
    let used = if forced || steps.is_empty() { opened } else { choose(&steps, opened) };
    Ok(StreamChoice { opened, used, forced, secs: if steps.is_empty() { 0.0 } else { t0.elapsed().as_secs_f64() }, steps })
}

/// Rank 0's partner: do each step rank 0 announces, until it says the probe is over.
fn follow(c: &mut Route, lead: usize) -> Result<()> {
    let mut send = Vec::new();
    let mut recv = Vec::new();
    loop {
        let mut m = [0u8; 16];
        // SAFETY: `m` outlives the wait.
        let h = unsafe { c.mesh.post_recv(lead, m.as_mut_ptr(), m.len(), TAG_CTL)? };
        c.mesh.wait(h)?;
        let k = u64::from_le_bytes(m[..8].try_into().unwrap()) as usize;
        let bytes = u64::from_le_bytes(m[8..].try_into().unwrap()) as usize;
        if k == 0 {
            return Ok(());
        }
        if bytes > MOST {
            return Err(Error::Stranger(format!("rank {lead} asked for a stream probe of {bytes} bytes (at most {MOST})")));
        }
        if send.len() < bytes {
            send.resize(bytes, 0);
            recv.resize(MSGS * bytes, 0);
        }
        c.mesh.open_all(lead)?;
        c.mesh.set_active(lead, k)?;
        exchange(c, lead, &send, &mut recv, bytes, Instant::now())?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_is_twice_the_most_streams_that_helped() {
        // A link one flow fills: two streams.
        assert_eq!(choose(&[(1, 100.0), (2, 101.0), (4, 99.0)], 12), 2);
        // Flows capped at an eighth of the link: all 12 opened (8 helped).
        assert_eq!(choose(&[(1, 31.0), (2, 62.0), (4, 124.0), (8, 220.0), (12, 235.0)], 12), 12);
        // Capped at a quarter: 4 helped, 8 did not: eight.
        assert_eq!(choose(&[(1, 25.0), (2, 50.0), (4, 98.0), (8, 100.0), (12, 101.0)], 12), 8);
        // A step that read low does not hide a later one that helped against the best before it.
        assert_eq!(choose(&[(1, 25.0), (2, 26.0), (4, 90.0), (8, 95.0), (12, 96.0)], 16), 8);
        // Never more than opened, never fewer than one; no probe keeps every stream.
        assert_eq!(choose(&[(1, 10.0), (2, 20.0), (4, 40.0)], 4), 4);
        assert_eq!(choose(&[(1, 10.0)], 1), 1);
        assert_eq!(choose(&[], 7), 7);
    }

    #[test]
    fn a_step_helps_by_a_share_of_its_ideal_gain() {
        assert!(helps(1, 100.0, 2, 131.0));
        assert!(!helps(1, 100.0, 2, 129.0));
        // 8 -> 12 streams: half the streams again, so 15% more.
        assert!(helps(8, 100.0, 12, 116.0));
        assert!(!helps(8, 100.0, 12, 114.0));
    }

    #[test]
    fn choice_round_trips_through_the_broadcast() {
        let c = StreamChoice { opened: 12, used: 9, forced: false, steps: vec![(1, 3.5e7), (2, 7.0e7), (4, 1.2e8)], secs: 0.031 };
        assert_eq!(StreamChoice::decode(&c.encode()), c);
        let f = StreamChoice { opened: 4, used: 4, forced: true, steps: vec![], secs: 0.0 };
        assert_eq!(StreamChoice::decode(&f.encode()), f);
    }
}
