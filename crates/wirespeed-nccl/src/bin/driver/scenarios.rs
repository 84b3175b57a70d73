//! One peer of the pair: set up as NCCL's proxy does, run a scenario, close.
//!
//! Buffers and requests: a buffer handed to the plugin outlives its request (tested done, or its
//! comm closed, before the buffer drops), as NCCL's contract (the plugin's ffi.rs) asks. An error
//! return (`?`) is the exception: the buffers go with requests pending, and main.rs then exits
//! the process (FAIL).
use crate::api::{Net, Ptr, Rc};
use crate::{Args, HINT_LINES, HINT_STREAMS, LOG_COUNTS, READY_LINES, REFUSAL_LINES};
use nccl_net_wirespeed::abi::{NetAttr, NetCommAttr, NCCL_NET_ATTR_UNDEF, NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_MAX_REQUESTS, NCCL_PTR_CUDA, NCCL_PTR_HOST, NCCL_SUCCESS};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

type R<T> = Result<T, String>;

fn nccl<T>(what: &str, r: Result<T, Rc>) -> R<T> {
    r.map_err(|rc| format!("{what} returned ncclResult {rc}"))
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn hear() -> R<String> {
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) => Err("the pair driver went away".into()),
        Ok(_) => Ok(line.trim_end().to_string()),
        Err(e) => Err(format!("stdin: {e}")),
    }
}

fn barrier() -> R<()> {
    say("BARRIER");
    match hear()?.as_str() {
        "GO" => Ok(()),
        other => Err(format!("expected GO, got {other:?}")),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> R<[u8; NCCL_NET_HANDLE_MAXSIZE]> {
    let mut out = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    if s.len() != 2 * out.len() {
        return Err(format!("a handle of {} hex digits", s.len()));
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| "bad hex in handle")?;
    }
    Ok(out)
}

/// Content of message `idx` from rank `from`: 64-bit words of a multiplicative hash, never zero,
/// so a byte that was not written stands out.
fn seed(from: usize, idx: usize) -> u64 {
    ((from as u64) << 40) ^ (idx as u64).wrapping_mul(0x100_0000_01b3) ^ 0x5157_0000
}

fn word(seed: u64, k: usize) -> u64 {
    (seed ^ k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 0x0101_0101_0101_0101
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    for (k, c) in chunks.by_ref().enumerate() {
        c.copy_from_slice(&word(seed, k).to_le_bytes());
    }
    let k = buf.len() / 8;
    let tail = buf.len() % 8;
    let w = word(seed, k).to_le_bytes();
    buf[8 * k..].copy_from_slice(&w[..tail]);
}

/// Index of the first byte that differs from `fill(seed)`, if any.
fn first_bad(buf: &[u8], seed: u64) -> Option<usize> {
    let mut chunks = buf.chunks_exact(8);
    for (k, c) in chunks.by_ref().enumerate() {
        if c != word(seed, k).to_le_bytes() {
            return Some(8 * k);
        }
    }
    let k = buf.len() / 8;
    let w = word(seed, k).to_le_bytes();
    (buf[8 * k..] != w[..buf.len() % 8]).then_some(8 * k)
}

/// A peer's connections: it receives from the other rank on `recv` and sends to it on `send`.
struct Peer {
    net: Net,
    rank: usize,
    listen: Ptr,
    send: Ptr,
    recv: Ptr,
    /// The other rank's listener, which `send` connected to.
    theirs: SocketAddr,
    deadline: Instant,
}

impl Peer {
    fn check_deadline(&self, what: &str) -> R<()> {
        if Instant::now() > self.deadline {
            return Err(format!("timed out: {what}"));
        }
        Ok(())
    }

    fn close_all(&mut self) -> R<()> {
        nccl("closeSend", self.net.close_send(self.send))?;
        nccl("closeRecv", self.net.close_recv(self.recv))?;
        nccl("closeListen", self.net.close_listen(self.listen))?;
        nccl("finalize", self.net.finalize_all())
    }
}

fn setup(a: &Args) -> R<Peer> {
    let mut net = Net::open(&a.lib, a.api)?;
    if net.name != "wirespeed" {
        return Err(format!("the table's name is {:?}, not \"wirespeed\"", net.name));
    }
    nccl("init", net.init(0x1000 + a.rank as u64))?;
    // A second communicator (v11+: its own context; before: NCCL calls init once, a repeat must
    // be harmless): the effective values are still logged once.
    nccl("init (second communicator)", net.init(0x2000 + a.rank as u64))?;
    let ndev = nccl("devices", net.devices())?;
    if ndev < 1 {
        return Err(format!("devices() = {ndev}"));
    }
    let p = nccl("getProperties", net.props(0))?;
    if p.ptr_support != NCCL_PTR_HOST || p.max_recvs != 1 || p.dev_type != 0 || p.speed <= 0 || p.max_comms < 1 || p.name.is_empty() {
        return Err(format!("unexpected properties {p:?}"));
    }
    if let Some((ndevs, dev0, max_p2p)) = p.vprops {
        if ndevs != 1 || dev0 != 0 || max_p2p < (1 << 30) {
            return Err(format!("unexpected v9+ properties {p:?}"));
        }
    }
    if net.props(ndev).is_ok() {
        return Err(format!("getProperties({ndev}) succeeded for a device that does not exist"));
    }
    say(&format!("PROPS api v{} devices {ndev} dev0 {} speed {} Mb/s pci {}", a.api, p.name, p.speed, p.pci_path.as_deref().unwrap_or("none")));

    let mut mine = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let listen = nccl("listen", net.listen(0, &mut mine))?;
    // A stranger knocks first: the listener must refuse it, and say so through NCCL's logger.
    let addr = nccl_net_wirespeed::handle::Handle::decode(&mine)?.addr;
    let mut stranger = std::net::TcpStream::connect(addr).map_err(|e| format!("stranger connect to {addr}: {e}"))?;
    std::io::Write::write_all(&mut stranger, &[0xa5u8; 64]).map_err(|e| format!("stranger write: {e}"))?;
    drop(stranger);
    say(&format!("HANDLE {}", hex(&mine)));
    let line = hear()?;
    let mut theirs = unhex(line.strip_prefix("HANDLE ").ok_or(format!("expected a handle, got {line:?}"))?)?;
    let their_addr = nccl_net_wirespeed::handle::Handle::decode(&theirs)?.addr;
    // NCCL (v11+) hands its hint to the plugin before every connect call of a connection.
    let hint = (a.scenario == "attr").then(attr_hint);
    if hint.is_some() && a.api < 11 {
        return Err(format!("the attr scenario needs API v11 or later (setNetAttr), not v{}", a.api));
    }

    // Both connections are made at once, without blocking, as NCCL's proxy does.
    let deadline = Instant::now() + a.timeout;
    let (mut send, mut recv) = (None, None);
    let (mut connect_calls, mut accept_calls) = (0, 0);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            connect_calls += 1;
            if let Some(h) = &hint {
                nccl("setNetAttr", net.set_net_attr(h).ok_or("the v11+ table has no setNetAttr")?)?;
            }
            send = nccl("connect", net.connect(0, &mut theirs))?;
        }
        if recv.is_none() {
            accept_calls += 1;
            recv = nccl("accept", net.accept(listen))?;
        }
        if Instant::now() > deadline {
            return Err("connect/accept did not complete within the timeout".into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    say(&format!("CONNECTED after {connect_calls} connect and {accept_calls} accept calls"));
    Ok(Peer { net, rank: a.rank, listen, send: send.unwrap(), recv: recv.unwrap(), theirs: their_addr, deadline })
}

/// Load and init only, as NCCL does before deciding whether to use the plugin.
pub fn probe(a: &Args) -> R<()> {
    let mut net = Net::open(&a.lib, a.api)?;
    nccl("init", net.init(1))?;
    let n = nccl("devices", net.devices())?;
    let p = nccl("getProperties", net.props(0))?;
    nccl("finalize", net.finalize_all())?;
    let name = net.name.clone();
    // NCCL dlcloses the plugin when its last communicator goes and may load it again for the
    // next: the engine's I/O threads keep running meanwhile, so the code must stay mapped.
    net.unload()?;
    std::thread::sleep(Duration::from_millis(300)); // several I/O-thread wake-ups
    let mut again = Net::open(&a.lib, a.api)?;
    nccl("init after dlclose and dlopen", again.init(2))?;
    nccl("devices after reload", again.devices())?;
    nccl("finalize", again.finalize_all())?;
    say(&format!("OK {name} API v{}: {n} device(s), first {} at {} Mb/s; reloaded after dlclose", a.api, p.name, p.speed));
    Ok(())
}

pub fn peer(a: &Args) -> R<()> {
    let mut p = setup(a)?;
    let summary = match a.scenario.as_str() {
        "sweep" => sweep(&mut p, a)?,
        "limit" => limit(&mut p)?,
        "oversize" => oversize(&mut p)?,
        "kill" => kill(&mut p)?,
        "close" => return close_in_flight(&mut p),
        "bench" => bench(&mut p, a)?,
        "early-close" => return early_close(&mut p),
        "attr" => attr(&mut p, a)?,
        s => return Err(format!("unknown scenario {s}")),
    };
    // Each side closes as soon as its own part is done, as NCCL does (see early_close).
    p.close_all()?;
    let ready = READY_LINES.load(std::sync::atomic::Ordering::Relaxed);
    if ready != 1 {
        return Err(format!("the effective configuration was logged {ready} times through NCCL's logger, not once"));
    }
    let refusals = REFUSAL_LINES.load(std::sync::atomic::Ordering::Relaxed);
    if refusals < 1 {
        return Err("the stranger's connection was not reported as refused through NCCL's logger (WARN)".into());
    }
    let warns = LOG_COUNTS[2].load(std::sync::atomic::Ordering::Relaxed);
    say(&format!("OK {summary} (logger: {ready} ready line, {warns} warnings)"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------

/// The message sizes of the sweep: edges around words, pages, chunks and 512 KiB NCCL steps, up
/// to `max`, with small random ones between (the same list on both sides).
fn sweep_sizes(max: usize, count: usize) -> Vec<usize> {
    let edges = [0usize, 1, 2, 3, 7, 8, 9, 127, 4095, 4096, 4097, 32767, 32768, 32769, 65535, 65536, 65537, 262_144, 524_288 + 5, 1 << 20, (1 << 20) + 1, 4 << 20, (16 << 20) + 3, 64 << 20];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut out = Vec::new();
    for _ in 0..count.max(1) {
        for &e in edges.iter().filter(|&&e| e <= max) {
            out.push(e);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push((x % 70_000) as usize);
        }
    }
    out
}

/// What NCCL's proxy hands setNetAttr before connecting a 2-rank communicator's collective
/// connections with 2 channels (populateCommNetAttrs in NCCL's transport/net.cc): up to
/// min(nRanks, 4) = 2 peers, up to nChannels = 2 flows per peer, each way; op, algo and proto
/// unsaid.
fn attr_hint() -> NetAttr {
    let c = NetCommAttr { maxConcurrentPeers: 2, minConcurrentPeers: 1, maxFlowsPerPeer: 2, minFlowsPerPeer: 1 };
    let undef = NCCL_NET_ATTR_UNDEF as u32;
    NetAttr { sendCommAttr: c, recvCommAttr: c, op: undef, algo: undef, proto: undef }
}

/// The established TCP connections of this network namespace to `to` (/proc/net/tcp, tcp6): the
/// streams this process dialed to the other rank's listener (the other rank's own streams go to
/// this rank's listener, and the stranger setup sent has closed).
fn established_to(to: SocketAddr) -> R<usize> {
    // The kernel prints each 32-bit word of the address as the hex of its value in memory.
    let words = |b: &[u8]| b.chunks(4).map(|w| format!("{:08X}", u32::from_ne_bytes(w.try_into().unwrap()))).collect::<String>();
    let (file, ip) = match to {
        SocketAddr::V4(a) => ("/proc/net/tcp", words(&a.ip().octets())),
        SocketAddr::V6(a) => ("/proc/net/tcp6", words(&a.ip().octets())),
    };
    let want = format!("{ip}:{:04X}", to.port());
    let table = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    // Columns: sl local_address rem_address st ...; st 01 is ESTABLISHED.
    Ok(table.lines().skip(1).filter(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[2] == want && f[3] == "01"
    }).count())
}

/// setup gave the plugin NCCL's hint (`attr_hint`) before each connect call: the connection must
/// open the streams the plugin logged at INFO (once), an operation's later hint must leave it
/// alone, and a sweep must go through it whole.
fn attr(p: &mut Peer, a: &Args) -> R<String> {
    let (lines, told) = (HINT_LINES.load(Ordering::Relaxed), HINT_STREAMS.load(Ordering::Relaxed));
    if lines != 1 || told == 0 {
        return Err(format!("NCCL's hint and the streams chosen from it were logged at INFO {lines} times (last count {told}), not once"));
    }
    let open = established_to(p.theirs)?;
    if open != told {
        return Err(format!("the plugin logged {told} streams per connection, but {open} are established to {}", p.theirs));
    }
    // An operation's own hint, as NCCL sends before its first isend when the counts differ: exact
    // counts and the op's bit (all_reduce). The next connect would read it; this one is made.
    let mut op = attr_hint();
    op.sendCommAttr = NetCommAttr { maxConcurrentPeers: 1, minConcurrentPeers: 1, maxFlowsPerPeer: 2, minFlowsPerPeer: 2 };
    op.op = 1 << 4;
    nccl("setNetAttr (an operation's hint)", p.net.set_net_attr(&op).ok_or("no setNetAttr")?)?;
    let swept = sweep(p, a)?;
    let after = established_to(p.theirs)?;
    // Neither side closes before both have counted.
    barrier()?;
    if after != told {
        return Err(format!("{after} streams established after the sweep, {told} before"));
    }
    Ok(format!("attr: NCCL's hint (1-2 peers x 1-2 flows) -> {told} streams per connection, as logged and as /proc/net/tcp counts; {swept}"))
}

struct Posted {
    idx: usize,
    req: Ptr,
    buf: Vec<u8>,
    mh: Ptr,
}

/// Slack a receive posts beyond the message (NCCL's receives are step-sized, often larger).
fn slack(idx: usize) -> usize {
    [0, 1, 4096][idx % 3]
}

const GUARD: usize = 64;
const UNTOUCHED: u8 = 0xEE;

fn sweep(p: &mut Peer, a: &Args) -> R<String> {
    let sizes = sweep_sizes(a.max_bytes, a.count);
    let n = sizes.len();
    let window = a.window.clamp(1, NCCL_NET_MAX_REQUESTS);
    let peer = 1 - p.rank;
    let (mut sends, mut recvs): (VecDeque<Posted>, VecDeque<Posted>) = (VecDeque::new(), VecDeque::new());
    let (mut next_send, mut next_recv, mut done_send, mut done_recv, mut bytes) = (0, 0, 0, 0, 0usize);
    let start = Instant::now();
    while done_send < n || done_recv < n {
        p.check_deadline(&format!("sweep: {done_send}/{n} sends and {done_recv}/{n} receives done"))?;
        while sends.len() < window && next_send < n {
            let mut buf = vec![0u8; sizes[next_send]];
            fill(&mut buf, seed(p.rank, next_send));
            let mh = nccl("regMr", p.net.reg_mr(p.send, buf.as_mut_ptr(), buf.len(), NCCL_PTR_HOST))?;
            // Empty messages go from a NULL pointer, as a C caller may pass them.
            let ptr = if buf.is_empty() { std::ptr::null() } else { buf.as_ptr() };
            // SAFETY: the buffer moves into `sends` (its heap block stays put) until tested done;
            // a NULL pointer goes only with size 0.
            match nccl("isend", unsafe { p.net.isend(p.send, ptr, buf.len(), peer as i32, mh) })? {
                Some(req) => sends.push_back(Posted { idx: next_send, req, buf, mh }),
                None => break,
            }
            next_send += 1;
        }
        while recvs.len() < window && next_recv < n {
            let cap = sizes[next_recv] + slack(next_recv);
            let mut buf = vec![UNTOUCHED; cap + GUARD];
            let mh = nccl("regMr", p.net.reg_mr(p.recv, buf.as_mut_ptr(), cap, NCCL_PTR_HOST))?;
            let ptr = if cap == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr() };
            // SAFETY: as for the sends: the buffer moves into `recvs` until tested done. The
            // plugin may write `cap` bytes; the guard after them must stay.
            match nccl("irecv", unsafe { p.net.irecv(p.recv, ptr, cap, p.rank as i32, mh) })? {
                Some(req) => recvs.push_back(Posted { idx: next_recv, req, buf, mh }),
                None => break,
            }
            next_recv += 1;
        }
        // NCCL tests its oldest request of each direction.
        if let Some(s) = sends.front() {
            if let Some(sent) = nccl(&format!("test (send {})", s.idx), p.net.test(s.req))? {
                if sent != sizes[s.idx] {
                    return Err(format!("send {} reported {sent} bytes, sent {}", s.idx, sizes[s.idx]));
                }
                nccl("deregMr", p.net.dereg_mr(p.send, s.mh))?;
                sends.pop_front();
                done_send += 1;
            }
        }
        if let Some(r) = recvs.front() {
            if let Some(got) = nccl(&format!("test (receive {})", r.idx), p.net.test(r.req))? {
                let want = sizes[r.idx];
                if got != want {
                    return Err(format!("receive {} reported {got} bytes, the message had {want}", r.idx));
                }
                if let Some(at) = first_bad(&r.buf[..want], seed(peer, r.idx)) {
                    return Err(format!("receive {} ({want} bytes): wrong byte at offset {at}", r.idx));
                }
                if let Some(at) = r.buf[want..].iter().position(|&b| b != UNTOUCHED) {
                    return Err(format!("receive {} ({want} bytes): byte {} past the message was written", r.idx, want + at));
                }
                if !nccl("iflush", p.net.iflush_is_noop(p.recv, r.buf.as_ptr() as *mut u8, want as i32, r.mh))? {
                    return Err("iflush returned a request for host memory".into());
                }
                nccl("deregMr", p.net.dereg_mr(p.recv, r.mh))?;
                bytes += want;
                recvs.pop_front();
                done_recv += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(format!("sweep: {n} messages each way ({} MiB received, largest {} B) checked byte for byte in {secs:.2} s", bytes >> 20, sizes.iter().max().unwrap()))
}

fn limit(p: &mut Peer) -> R<String> {
    let peer = 1 - p.rank;
    let max = NCCL_NET_MAX_REQUESTS;
    let mut rbufs: Vec<Vec<u8>> = (0..=max).map(|_| vec![0u8; 16]).collect();
    let sbufs: Vec<Vec<u8>> = (0..=max).map(|i| { let mut b = vec![0u8; 16]; fill(&mut b, seed(p.rank, i)); b }).collect();
    let mut rreqs = Vec::new();
    let mut sreqs = Vec::new();
    // Untested requests hold their slots, so the (max+1)-th post of each kind must come back NULL.
    for i in 0..=max {
        // SAFETY: `rbufs` lives until this function returns, after every receive is tested done
        // below; the post beyond the limit returns no request.
        let r = nccl("irecv", unsafe { p.net.irecv(p.recv, rbufs[i].as_mut_ptr(), 16, p.rank as i32, std::ptr::null_mut()) })?;
        match (i < max, r) {
            (true, Some(r)) => rreqs.push(r),
            (true, None) => return Err(format!("irecv {i} returned NULL below the limit of {max}")),
            (false, Some(_)) => return Err(format!("irecv {} beyond the limit returned a request", max + 1)),
            (false, None) => {}
        }
        // SAFETY: likewise `sbufs`, unwritten, for the sends.
        let s = nccl("isend", unsafe { p.net.isend(p.send, sbufs[i].as_ptr(), 16, peer as i32, std::ptr::null_mut()) })?;
        match (i < max, s) {
            (true, Some(s)) => sreqs.push(s),
            (true, None) => return Err(format!("isend {i} returned NULL below the limit of {max}")),
            (false, Some(_)) => return Err(format!("isend {} beyond the limit returned a request", max + 1)),
            (false, None) => {}
        }
    }
    let wait = |req: Ptr, what: &str| -> R<usize> {
        loop {
            if let Some(n) = nccl(what, p.net.test(req))? {
                return Ok(n);
            }
            p.check_deadline(what)?;
            std::thread::yield_now();
        }
    };
    for (i, r) in rreqs.iter().enumerate() {
        let n = wait(*r, "test (receive)")?;
        if n != 16 || first_bad(&rbufs[i], seed(peer, i)).is_some() {
            return Err(format!("receive {i}: {n} bytes or wrong content"));
        }
    }
    for s in &sreqs {
        wait(*s, "test (send)")?;
    }
    // The slots are free again: one more of each goes through.
    // SAFETY: `rbufs[max]` outlives this receive, tested done below.
    let r = nccl("irecv", unsafe { p.net.irecv(p.recv, rbufs[max].as_mut_ptr(), 16, p.rank as i32, std::ptr::null_mut()) })?.ok_or("irecv still NULL after the slots were freed")?;
    // SAFETY: `sbufs[max]` outlives this send, tested done below.
    let s = nccl("isend", unsafe { p.net.isend(p.send, sbufs[max].as_ptr(), 16, peer as i32, std::ptr::null_mut()) })?.ok_or("isend still NULL after the slots were freed")?;
    wait(r, "test (receive)")?;
    wait(s, "test (send)")?;
    if first_bad(&rbufs[max], seed(peer, max)).is_some() {
        return Err("the message after the limit arrived wrong".into());
    }
    Ok(format!("limit: {max} requests of each kind in flight, the next NULL, accepted again once tested"))
}

fn oversize(p: &mut Peer) -> R<String> {
    const SENT: usize = 100_000;
    const CAP: usize = 1000;
    let out = if p.rank == 1 {
        let mut buf = vec![0u8; SENT];
        fill(&mut buf, seed(1, 0));
        // SAFETY: `buf` lives until `test` reports the send done or failed below; a failure
        // shuts the connection, so the engine sends no more of it.
        let s = nccl("isend", unsafe { p.net.isend(p.send, buf.as_ptr(), SENT, 0, std::ptr::null_mut()) })?.ok_or("isend NULL")?;
        // The sender may see its bytes leave (done) or the receiver's refusal (an error).
        let how = loop {
            match p.net.test(s) {
                Ok(Some(_)) => break "completed".to_string(),
                Ok(None) => {}
                Err(rc) => break format!("failed with ncclResult {rc}"),
            }
            p.check_deadline("the oversize send")?;
            std::thread::yield_now();
        };
        barrier()?;
        format!("oversize: sent {SENT} bytes into a {CAP}-byte receive; the send {how}")
    } else {
        let mut buf = vec![UNTOUCHED; CAP + 4096];
        // SAFETY: `buf` outlives the receive, which fails on the oversize header before any byte
        // is written.
        let r = nccl("irecv", unsafe { p.net.irecv(p.recv, buf.as_mut_ptr(), CAP, 0, std::ptr::null_mut()) })?.ok_or("irecv NULL")?;
        let t = Instant::now();
        let rc = loop {
            match p.net.test(r) {
                Ok(Some(n)) => return Err(format!("a {SENT}-byte message into a {CAP}-byte receive completed with {n} bytes")),
                Ok(None) => {}
                Err(rc) => break rc,
            }
            p.check_deadline("the oversize receive to fail")?;
            std::thread::yield_now();
        };
        if let Some(at) = buf[CAP..].iter().position(|&b| b != UNTOUCHED) {
            return Err(format!("the oversize message was written past the posted buffer (byte {})", CAP + at));
        }
        barrier()?;
        format!("oversize: a {SENT}-byte message into a {CAP}-byte receive failed with ncclResult {rc} after {:.1} ms, nothing written past the buffer", t.elapsed().as_secs_f64() * 1e3)
    };
    Ok(out)
}

/// Rank 1 starts a big send and kills itself; rank 0's pending receive and send must both fail
/// within the timeout.
fn kill(p: &mut Peer) -> R<String> {
    const BIG: usize = 128 << 20;
    if p.rank == 1 {
        let buf = vec![0xABu8; BIG]; // never zero, so rank 0 can count what arrived
        barrier()?; // rank 0 has posted its receive and send
        // SAFETY: `buf` is never freed: this process kills itself below with the send in flight.
        let s = nccl("isend", unsafe { p.net.isend(p.send, buf.as_ptr(), BIG, 0, std::ptr::null_mut()) })?.ok_or("isend NULL")?;
        let _ = p.net.test(s);
        say("KILLING myself mid-transfer");
        // SAFETY: ends this process at once, as a crash or an OOM kill would.
        unsafe { libc::raise(libc::SIGKILL) };
        unreachable!("SIGKILL returned");
    }
    let mut rbuf = vec![0u8; BIG];
    let sbuf = vec![0xCDu8; BIG];
    // SAFETY: `rbuf` lives until the receive has failed (the loop below waits for it); a failed
    // connection is shut, so the engine writes no more of it.
    let r = nccl("irecv", unsafe { p.net.irecv(p.recv, rbuf.as_mut_ptr(), BIG, 0, std::ptr::null_mut()) })?.ok_or("irecv NULL")?;
    // SAFETY: likewise `sbuf`, unwritten, for the send.
    let s = nccl("isend", unsafe { p.net.isend(p.send, sbuf.as_ptr(), BIG, 1, std::ptr::null_mut()) })?.ok_or("isend NULL")?;
    barrier()?;
    let t = Instant::now();
    let (mut recv_rc, mut send_rc) = (None, None);
    while recv_rc.is_none() || send_rc.is_none() {
        if recv_rc.is_none() {
            match p.net.test(r) {
                Ok(Some(n)) => return Err(format!("the receive completed ({n} bytes) although its sender was killed")),
                Ok(None) => {}
                Err(rc) => recv_rc = Some((rc, t.elapsed())),
            }
        }
        if send_rc.is_none() {
            match p.net.test(s) {
                Ok(Some(n)) => return Err(format!("the {n}-byte send completed although its receiver was killed before receiving")),
                Ok(None) => {}
                Err(rc) => send_rc = Some((rc, t.elapsed())),
            }
        }
        p.check_deadline("pending requests to fail after the peer was killed")?;
        std::thread::sleep(Duration::from_micros(200));
    }
    let (rrc, rt) = recv_rc.unwrap();
    let (src, st) = send_rc.unwrap();
    if rrc == NCCL_SUCCESS || src == NCCL_SUCCESS {
        return Err("an error path returned ncclSuccess".into());
    }
    let got = rbuf.chunks_exact(8).filter(|w| w.iter().any(|&b| b != 0)).count() * 8;
    Ok(format!(
        "kill: the peer died mid-transfer; the receive failed with ncclResult {rrc} after {:.0} ms ({:.1} of {} MiB had arrived), the send with ncclResult {src} after {:.0} ms",
        rt.as_secs_f64() * 1e3,
        got as f64 / (1 << 20) as f64,
        BIG >> 20,
        st.as_secs_f64() * 1e3
    ))
}

/// Rank 0 sends 256 MiB that rank 1 never receives (more than the sockets buffer) and posts 8
/// receives of 32 MiB; rank 1 starts sending into them, and while those bytes stream in, rank 0
/// closes everything. Close must return at once, and once it has, the plugin must not write into
/// rank 0's buffers any more. Rank 1 then closes with its own requests in flight.
fn close_in_flight(p: &mut Peer) -> R<()> {
    const BIG: usize = 64 << 20;
    const MSG: usize = 32 << 20;
    const NRECV: usize = 8;
    if p.rank == 1 {
        barrier()?; // rank 0 has posted
        let data = vec![0x77u8; MSG];
        let mut pending = 0;
        for _ in 0..NRECV {
            // SAFETY: `data` lives until after close_all below (dropped explicitly then), and is
            // not written.
            nccl("isend", unsafe { p.net.isend(p.send, data.as_ptr(), MSG, 0, std::ptr::null_mut()) })?.ok_or("isend NULL")?;
            pending += 1;
        }
        let mut big = vec![0u8; BIG];
        // SAFETY: likewise `big`, which nothing else touches until then.
        nccl("irecv", unsafe { p.net.irecv(p.recv, big.as_mut_ptr(), BIG, 1, std::ptr::null_mut()) })?.ok_or("irecv NULL")?;
        pending += 1;
        barrier()?; // rank 0 closes now, mid-stream
        barrier()?; // rank 0 closed and checked its buffers
        let t = Instant::now();
        p.close_all()?;
        let took = t.elapsed();
        if took > Duration::from_secs(2) {
            return Err(format!("closing with requests in flight took {took:?}"));
        }
        drop((data, big)); // closed: the plugin no longer touches them
        say(&format!("OK close: {pending} requests posted, comms closed in {:.1} ms", took.as_secs_f64() * 1e3));
        return Ok(());
    }
    let mut rbufs: Vec<Vec<u8>> = (0..NRECV).map(|_| vec![0u8; MSG]).collect();
    let sbuf = vec![0xABu8; BIG];
    for b in rbufs.iter_mut() {
        // SAFETY: `rbufs` is not touched until close_all below returns, after which the plugin
        // writes no more of it (what this scenario checks), and drops after that.
        nccl("irecv", unsafe { p.net.irecv(p.recv, b.as_mut_ptr(), MSG, 0, std::ptr::null_mut()) })?.ok_or("irecv NULL")?;
    }
    for _ in 0..4 {
        // SAFETY: likewise `sbuf`, unwritten, which drops after close_all.
        nccl("isend", unsafe { p.net.isend(p.send, sbuf.as_ptr(), BIG, 1, std::ptr::null_mut()) })?.ok_or("isend NULL")?;
    }
    barrier()?;
    barrier()?; // rank 1's messages are on their way
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    p.close_all()?;
    let took = t.elapsed();
    if took > Duration::from_secs(2) {
        return Err(format!("closing with requests in flight took {took:?}"));
    }
    let arrived = rbufs.iter().map(|b| b.iter().filter(|&&x| x == 0x77).count()).sum::<usize>();
    // From here on the buffers are ours again: mark them and check nobody writes them.
    for b in rbufs.iter_mut() {
        b.fill(0x5A);
    }
    std::thread::sleep(Duration::from_millis(300));
    if rbufs.iter().any(|b| b.iter().any(|&x| x != 0x5A)) {
        return Err("a receive buffer was written after its comm was closed".into());
    }
    barrier()?;
    say(&format!(
        "OK close: 12 requests in flight, closed in {:.1} ms with {:.1} of {} MiB received, buffers untouched afterwards",
        took.as_secs_f64() * 1e3,
        arrived as f64 / (1 << 20) as f64,
        (NRECV * MSG) >> 20
    ));
    Ok(())
}

/// Rank 0 sends 64 messages of 256 KiB and closes its comms as soon as its sends report done (NCCL
/// destroys a communicator once its own operations completed, without waiting for the peer);
/// rank 1 posts its receives one at a time, slowly. Every message was handed to TCP before the
/// close, so every receive must still complete with the right bytes.
fn early_close(p: &mut Peer) -> R<()> {
    const N: usize = 64;
    const MSG: usize = 256 << 10;
    if p.rank == 0 {
        let bufs: Vec<Vec<u8>> = (0..N).map(|i| { let mut b = vec![0u8; MSG]; fill(&mut b, seed(0, i)); b }).collect();
        let mut reqs = VecDeque::new();
        for b in &bufs {
            // SAFETY: `bufs` outlives every send: all are tested done below before close_all.
            reqs.push_back(nccl("isend", unsafe { p.net.isend(p.send, b.as_ptr(), MSG, 1, std::ptr::null_mut()) })?.ok_or("isend NULL")?);
            while reqs.len() >= NCCL_NET_MAX_REQUESTS {
                if nccl("test (send)", p.net.test(*reqs.front().unwrap()))?.is_some() {
                    reqs.pop_front();
                }
                p.check_deadline("early-close sends")?;
            }
        }
        while let Some(&r) = reqs.front() {
            if nccl("test (send)", p.net.test(r))?.is_some() {
                reqs.pop_front();
            }
            p.check_deadline("early-close sends")?;
        }
        p.close_all()?;
        say(&format!("OK early-close: {N} sends of {MSG} B done, comms closed at once"));
        return Ok(());
    }
    let mut buf = vec![0u8; MSG];
    for i in 0..N {
        std::thread::sleep(Duration::from_millis(2));
        // SAFETY: `buf` outlives the receive, tested done below before the next one reuses it.
        let r = nccl("irecv", unsafe { p.net.irecv(p.recv, buf.as_mut_ptr(), MSG, 1, std::ptr::null_mut()) })?.ok_or("irecv NULL")?;
        loop {
            match p.net.test(r) {
                Ok(Some(n)) if n == MSG && first_bad(&buf, seed(0, i)).is_none() => break,
                Ok(Some(n)) => return Err(format!("message {i} arrived wrong ({n} bytes)")),
                Ok(None) => {}
                Err(rc) => return Err(format!("message {i} of {N}: the receive failed with ncclResult {rc} after the sender closed cleanly")),
            }
            p.check_deadline("early-close receives")?;
        }
    }
    p.close_all()?;
    say(&format!("OK early-close: all {N} messages received after the sender had closed"));
    Ok(())
}

/// Throughput: rank 0 sends `total` bytes to rank 1 in `msg`-sized messages with `window` in
/// flight (NCCL keeps up to 8 steps of 512 KiB in flight per connection by default); with
/// --bidir both directions at once, as a ring all_reduce does. The receiver reports.
fn bench(p: &mut Peer, a: &Args) -> R<String> {
    let n = (a.total / a.msg).max(1);
    let warm = a.window.min(n / 4);
    let window = a.window.clamp(1, NCCL_NET_MAX_REQUESTS);
    let sending = p.rank == 0 || a.bidir;
    let receiving = p.rank == 1 || a.bidir;
    let peer = 1 - p.rank;
    let mut sbufs: Vec<Vec<u8>> = (0..window).map(|i| { let mut b = vec![0u8; a.msg]; fill(&mut b, seed(p.rank, i)); b }).collect();
    let mut rbufs: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; a.msg]).collect();
    let smh: Vec<Ptr> = sbufs.iter_mut().map(|b| p.net.reg_mr(p.send, b.as_mut_ptr(), b.len(), NCCL_PTR_HOST)).collect::<Result<_, _>>().map_err(|rc| format!("regMr {rc}"))?;
    let rmh: Vec<Ptr> = rbufs.iter_mut().map(|b| p.net.reg_mr(p.recv, b.as_mut_ptr(), b.len(), NCCL_PTR_HOST)).collect::<Result<_, _>>().map_err(|rc| format!("regMr {rc}"))?;
    if p.net.reg_mr(p.recv, rbufs[0].as_mut_ptr(), 8, NCCL_PTR_CUDA).is_ok() {
        return Err("regMr accepted CUDA memory although ptrSupport is host only".into());
    }
    barrier()?;
    let (mut sq, mut rq): (VecDeque<(usize, Ptr)>, VecDeque<(usize, Ptr)>) = (VecDeque::new(), VecDeque::new());
    let (mut ns, mut nr, mut ds, mut dr) = (0usize, 0usize, 0usize, 0usize);
    let (ns_total, nr_total) = (if sending { n } else { 0 }, if receiving { n } else { 0 });
    let mut t0 = Instant::now();
    while ds < ns_total || dr < nr_total {
        p.check_deadline(&format!("bench: {ds}/{ns_total} sent, {dr}/{nr_total} received"))?;
        while sq.len() < window && ns < ns_total {
            let slot = ns % window;
            // SAFETY: `sbufs` outlives every send, each tested done in this loop; slot `slot` is
            // reused only after its previous send was (window requests at most).
            match nccl("isend", unsafe { p.net.isend(p.send, sbufs[slot].as_ptr(), a.msg, peer as i32, smh[slot]) })? {
                Some(r) => sq.push_back((slot, r)),
                None => break,
            }
            ns += 1;
        }
        while rq.len() < window && nr < nr_total {
            let slot = nr % window;
            // SAFETY: likewise `rbufs` for the receives, read only once tested done.
            match nccl("irecv", unsafe { p.net.irecv(p.recv, rbufs[slot].as_mut_ptr(), a.msg, p.rank as i32, rmh[slot]) })? {
                Some(r) => rq.push_back((slot, r)),
                None => break,
            }
            nr += 1;
        }
        if let Some(&(_, r)) = sq.front() {
            if nccl("test (send)", p.net.test(r))?.is_some() {
                sq.pop_front();
                ds += 1;
            }
        }
        if let Some(&(slot, r)) = rq.front() {
            if let Some(got) = nccl("test (receive)", p.net.test(r))? {
                // Spot-check content: the first messages and the last one, byte for byte.
                let idx = dr % window;
                if got != a.msg || ((dr < window || dr + 1 == nr_total) && first_bad(&rbufs[slot], seed(peer, idx)).is_some()) {
                    return Err(format!("bench: message {dr} arrived wrong ({got} bytes)"));
                }
                rq.pop_front();
                dr += 1;
                if dr == warm {
                    t0 = Instant::now();
                }
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    barrier()?;
    if !receiving {
        return Ok(format!("bench: sent {n} messages of {} B", a.msg));
    }
    let bytes = ((n - warm) * a.msg) as f64;
    let streams = std::env::var("WIRESPEED_NSTREAMS").unwrap_or_else(|_| "default".into());
    say(&format!("RESULT streams={streams} msg={} window={window} bidir={} bytes={} secs={secs:.4} GBps={:.4}", a.msg, a.bidir as u8, bytes as u64, bytes / secs / 1e9));
    Ok(format!("bench: received {n} messages of {} B", a.msg))
}
