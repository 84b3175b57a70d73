//! wirespeed-nccl-driver: drives the NCCL net plugin through dlopen between two processes the way
//! NCCL's proxy threads do, without NCCL or a GPU.
//!
//! `pair` starts two `peer` processes (optionally each under a command prefix such as
//! `ip netns exec h0`, to put them on two emulated hosts) and relays what NCCL's bootstrap would:
//! each peer's connection handle to the other, and barriers. Each peer opens the library, calls
//! init/devices/getProperties, listens, connects to the other's handle and accepts its connection
//! (both without blocking, looping until ready), runs one scenario, and closes everything.
//!
//! Scenarios: `sweep` (many concurrent isend/irecv both ways, 0 B to 64 MiB, checked byte for
//! byte), `limit` (NULL request once a comm has the maximum in flight), `oversize` (a message
//! larger than the posted buffer is an error and writes nothing past it), `kill` (a peer killed
//! mid-transfer: every pending request errors within the timeout), `close` (closing comms with
//! requests in flight returns at once and leaves the buffers alone), `bench` (throughput),
//! `attr` (v11+: NCCL's setNetAttr hint before connect sets the streams the connection opens).
//!
//! Usage:
//!   wirespeed-nccl-driver pair --scenario sweep [--api 11] [--lib PATH] [--timeout S]
//!       [--wrap0 "CMD ..."] [--wrap1 "CMD ..."] [--count N] [--max-bytes B]
//!       [--msg B] [--window W] [--total B] [--bidir]
//!   wirespeed-nccl-driver probe [--api N] [--lib PATH]   (init + devices only: is it usable here?)
//! Exit status 0 when every expectation held; a line starting with FAIL says which did not.
mod api;
mod scenarios;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Lines the plugin logged through the driver's logger, by level (index = ncclDebugLogLevel).
pub static LOG_COUNTS: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];
/// How many INFO lines announced the effective configuration ("ready:").
pub static READY_LINES: AtomicUsize = AtomicUsize::new(0);
/// How many WARN lines reported a refused connection.
pub static REFUSAL_LINES: AtomicUsize = AtomicUsize::new(0);
/// How many INFO lines told NCCL's hint and the streams chosen from it, and the last count told.
pub static HINT_LINES: AtomicUsize = AtomicUsize::new(0);
pub static HINT_STREAMS: AtomicUsize = AtomicUsize::new(0);

#[no_mangle]
/// Called by logger.c with each formatted line.
///
/// # Safety
/// `msg` is NULL or a NUL-terminated string, valid for reads for the call.
pub unsafe extern "C" fn driver_log_line(level: std::ffi::c_int, _flags: std::ffi::c_ulong, msg: *const std::ffi::c_char) {
    // SAFETY: this fn's contract (NULL is checked); logger.c, its one caller, passes the line it
    // formatted into a buffer on its stack, alive for this call.
    let text = if msg.is_null() { String::new() } else { unsafe { std::ffi::CStr::from_ptr(msg) }.to_string_lossy().into_owned() };
    if let Some(c) = usize::try_from(level).ok().and_then(|l| LOG_COUNTS.get(l)) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    if text.contains(" ready: ") {
        READY_LINES.fetch_add(1, Ordering::Relaxed);
    }
    if level == 2 && text.contains("refused a connection") {
        REFUSAL_LINES.fetch_add(1, Ordering::Relaxed);
    }
    // "... NCCL's hint: send 1-2 peers x ...: 6 streams per connection (...)": the word before.
    if text.contains("NCCL's hint: ") {
        let n = text.split(" streams per connection").next().and_then(|h| h.rsplit(' ').next()).and_then(|n| n.parse().ok());
        HINT_LINES.fetch_add(1, Ordering::Relaxed);
        HINT_STREAMS.store(n.unwrap_or(0), Ordering::Relaxed);
    }
    let tag = match level {
        2 => "WARN",
        3 => "INFO",
        _ => "LOG",
    };
    eprintln!("[plugin {tag}] {text}");
}

#[derive(Clone, Debug)]
pub struct Args {
    pub mode: String,
    pub scenario: String,
    pub api: u32,
    pub lib: String,
    pub rank: usize,
    pub timeout: Duration,
    pub wrap: [Vec<String>; 2],
    pub count: usize,
    pub max_bytes: usize,
    pub msg: usize,
    pub window: usize,
    pub total: usize,
    pub bidir: bool,
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let bad = || format!("not a size: {s:?} (e.g. 512K, 64M)");
    // checked: 17179869184G wrapped to 0 and a sweep of nothing reported PASS.
    num.parse::<usize>().map_err(|_| bad())?.checked_mul(mul).ok_or_else(|| format!("{s:?} is too large"))
}

/// Seconds for --timeout: finite, positive and at most a day (Instant + 1e30 s panics).
fn parse_timeout(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => Ok(Duration::from_secs_f64(t)),
        _ => Err(format!("--timeout {s:?}: give seconds, more than 0 and at most 86400")),
    }
}

/// The library next to the driver: cargo's name in target/<profile>/, the installed name in
/// target/nccl-plugin/ (`make plugin`).
fn default_lib() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(|d| d.to_path_buf()).unwrap_or_default();
    let installed = dir.join("libnccl-net-wirespeed.so");
    let lib = if installed.exists() { installed } else { dir.join("libnccl_net_wirespeed.so") };
    lib.to_string_lossy().into_owned()
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mode = it.next().ok_or("give a mode: pair (or peer, which pair starts)")?;
    let mut a = Args {
        mode,
        scenario: "sweep".into(),
        api: 11,
        lib: default_lib(),
        rank: 0,
        timeout: Duration::from_secs(60),
        wrap: [vec![], vec![]],
        count: 1,
        max_bytes: 64 << 20,
        msg: 512 << 10,
        window: 8,
        total: 512 << 20,
        bidir: false,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--scenario" => a.scenario = val()?,
            "--api" => a.api = val()?.parse().map_err(|_| "--api takes 8..12")?,
            "--lib" => a.lib = val()?,
            "--rank" => a.rank = val()?.parse().map_err(|_| "--rank takes 0 or 1")?,
            "--timeout" => a.timeout = parse_timeout(&val()?)?,
            "--wrap0" => a.wrap[0] = val()?.split_whitespace().map(String::from).collect(),
            "--wrap1" => a.wrap[1] = val()?.split_whitespace().map(String::from).collect(),
            "--count" => a.count = val()?.parse().map_err(|_| "--count takes a number")?,
            "--max-bytes" => a.max_bytes = parse_bytes(&val()?)?,
            "--msg" => a.msg = parse_bytes(&val()?)?,
            "--window" => a.window = val()?.parse().map_err(|_| "--window takes a number")?,
            "--total" => a.total = parse_bytes(&val()?)?,
            "--bidir" => a.bidir = true,
            f => return Err(format!("unknown flag {f}")),
        }
    }
    if !(8..=12).contains(&a.api) {
        return Err(format!("--api {}: the plugin exports versions 8 to 12", a.api));
    }
    if a.window == 0 || a.msg == 0 || a.count == 0 || a.max_bytes == 0 || a.total == 0 {
        return Err("--window, --msg, --count, --max-bytes and --total must be positive".into());
    }
    Ok(a)
}

/// The arguments a peer gets: everything but the mode, wraps and rank.
fn peer_argv(a: &Args, rank: usize) -> Vec<String> {
    let mut v = vec![
        "peer".to_string(),
        "--scenario".into(),
        a.scenario.clone(),
        "--api".into(),
        a.api.to_string(),
        "--lib".into(),
        a.lib.clone(),
        "--rank".into(),
        rank.to_string(),
        "--timeout".into(),
        a.timeout.as_secs_f64().to_string(),
        "--count".into(),
        a.count.to_string(),
        "--max-bytes".into(),
        a.max_bytes.to_string(),
        "--msg".into(),
        a.msg.to_string(),
        "--window".into(),
        a.window.to_string(),
        "--total".into(),
        a.total.to_string(),
    ];
    if a.bidir {
        v.push("--bidir".into());
    }
    v
}

fn spawn_peer(a: &Args, rank: usize) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut argv: Vec<String> = a.wrap[rank].clone();
    argv.push(exe.to_string_lossy().into_owned());
    argv.extend(peer_argv(a, rank));
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start peer {rank} ({}): {e}", argv.join(" ")))
}

/// Run two peers, relay handles and barriers, check how each ended. Never outlives the timeout
/// (plus a grace for the peers' own deadlines).
fn pair(a: &Args) -> Result<(), String> {
    let mut kids = [spawn_peer(a, 0)?, spawn_peer(a, 1)?];
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    for (r, k) in kids.iter_mut().enumerate() {
        let out = k.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, Some(line)));
            }
            let _ = tx.send((r, None));
        });
    }
    let mut stdins = [kids[0].stdin.take(), kids[1].stdin.take()];
    let deadline = Instant::now() + a.timeout + Duration::from_secs(10);
    let mut barrier = [0usize; 2];
    let mut open = [true, true];
    let mut failures = Vec::new();
    while open[0] || open[1] {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((r, line)) = rx.recv_timeout(left) else {
            failures.push("the peers did not finish within the timeout".to_string());
            break;
        };
        let Some(line) = line else {
            open[r] = false;
            stdins[r] = None;
            continue;
        };
        println!("rank {r}: {line}");
        let mut send = |to: usize, text: &str| {
            if let Some(w) = stdins[to].as_mut() {
                let _ = writeln!(w, "{text}").and_then(|_| w.flush());
            }
        };
        if let Some(h) = line.strip_prefix("HANDLE ") {
            send(1 - r, &format!("HANDLE {h}"));
        } else if line == "BARRIER" {
            barrier[r] += 1;
            if barrier[0] == barrier[1] {
                send(0, "GO");
                send(1, "GO");
            }
        } else if line.starts_with("FAIL") {
            // The other peer may be waiting at a barrier for this one: give it a moment to report
            // its own view, then end both.
            failures.push(format!("rank {r}: {line}"));
            let until = Instant::now() + Duration::from_millis(1500);
            while let Ok((r2, Some(l2))) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                println!("rank {r2}: {l2}");
            }
            for k in kids.iter_mut() {
                let _ = k.kill();
            }
            break;
        }
    }
    // The kill scenario's rank 1 ends itself with SIGKILL; everyone else must exit 0.
    for (r, k) in kids.iter_mut().enumerate() {
        let status = loop {
            match k.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = k.kill();
                    failures.push(format!("rank {r} was still running at the deadline (killed)"));
                    break k.wait().ok();
                }
            }
        };
        let expect_kill = a.scenario == "kill" && r == 1;
        use std::os::unix::process::ExitStatusExt;
        match status {
            Some(s) if expect_kill && s.signal() == Some(libc::SIGKILL) => {}
            Some(s) if !expect_kill && s.success() => {}
            Some(s) if failures.is_empty() => failures.push(format!("rank {r} ended with {s}")),
            Some(_) => {}
            None => failures.push(format!("rank {r}: no exit status")),
        }
    }
    if failures.is_empty() {
        println!("PASS {} (API v{})", a.scenario, a.api);
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("wirespeed-nccl-driver: {e}");
            std::process::exit(2);
        }
    };
    let result = match a.mode.as_str() {
        "pair" => pair(&a),
        "peer" => scenarios::peer(&a),
        "probe" => scenarios::probe(&a),
        m => Err(format!("unknown mode {m}: pair or peer")),
    };
    if let Err(e) = result {
        println!("FAIL {e}");
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
}
