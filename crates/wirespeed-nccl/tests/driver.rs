//! The plugin as NCCL loads it: the built shared library, its exported symbols, and the driver
//! (src/bin/driver) running each scenario between two real processes over loopback.
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;

/// The scenarios move up to a few hundred MiB per process: one at a time on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn driver() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wirespeed-nccl-driver"))
}

/// The cdylib as `cargo test` just built it: target/<profile>/deps/ (cargo only copies it up to
/// target/<profile>/ on `cargo build`, so the copy there may be stale).
fn library() -> PathBuf {
    let lib = driver().parent().unwrap().join("deps").join("libnccl_net_wirespeed.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut c = Command::new(driver());
    c.args(args).arg("--lib").arg(library());
    // A clean slate: only what the test sets decides the plugin's configuration.
    for v in ["WIRESPEED_NSTREAMS", "WIRESPEED_CHUNK_BYTES", "WIRESPEED_IO_THREADS", "WIRESPEED_SOCKBUF", "WIRESPEED_IFNAME", "NCCL_SOCKET_IFNAME", "WIRESPEED_SOCKET_FAMILY", "NCCL_SOCKET_FAMILY", "WIRESPEED_NET_ALLOW_LOOPBACK"] {
        c.env_remove(v);
    }
    c.env("WIRESPEED_IFNAME", "lo").env("WIRESPEED_NET_ALLOW_LOOPBACK", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the driver runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Run a scenario between two processes; it must pass, and its report is returned.
fn pair(scenario: &str, api: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec!["pair", "--scenario", scenario, "--api", api, "--timeout", "60"];
    args.extend_from_slice(extra);
    let o = run(&args, env);
    let out = text(&o);
    assert!(o.status.success(), "scenario {scenario} on API v{api} failed:\n{out}");
    assert!(out.contains(&format!("PASS {scenario} (API v{api})")), "{out}");
    out
}

#[test]
fn exports_every_api_version_nccl_looks_for() {
    let lib = library();
    // dlsym through the driver: each version's table loads and inits.
    for api in ["8", "9", "10", "11", "12"] {
        let o = run(&["probe", "--api", api], &[]);
        let out = text(&o);
        assert!(o.status.success(), "API v{api}: {out}");
        assert!(out.contains(&format!("OK wirespeed API v{api}: 1 device(s), first lo")) && out.contains("reloaded after dlclose"), "{out}");
    }
    // And as the dynamic symbol table lists them (what `nm -D` shows a user).
    match Command::new("nm").arg("-D").arg("--defined-only").arg(&lib).output() {
        Ok(o) if o.status.success() => {
            let syms = String::from_utf8_lossy(&o.stdout);
            for v in 8..=12 {
                let name = format!("ncclNetPlugin_v{v}");
                assert!(syms.lines().any(|l| l.ends_with(&format!(" D {name}")) || l.ends_with(&format!(" R {name}"))), "nm -D lacks {name}:\n{syms}");
            }
            assert!(!syms.contains("ncclNetPlugin_v7"), "v7 is not implemented and must not be exported");
        }
        other => panic!("`nm -D` could not list {}: {other:?} (install binutils)", lib.display()),
    }
    // Linked with -z nodelete (build.rs): NCCL's dlclose must never unmap code the engine's I/O
    // threads may be running. (The probe above also reloads the library after a dlclose.)
    let o = Command::new("readelf").arg("-d").arg(&lib).output().expect("readelf (binutils) runs");
    assert!(String::from_utf8_lossy(&o.stdout).lines().any(|l| l.contains("FLAGS_1") && l.contains("NODELETE")), "{} lacks DF_1_NODELETE", lib.display());
}

#[test]
fn sweep_to_64_mib_both_ways_on_the_api_pytorch_nccl_loads() {
    let out = pair("sweep", "11", &[], &[]);
    assert!(out.contains("largest 67108864 B) checked byte for byte"), "{out}");
    // init ran twice per process (two communicators), the effective values were logged once.
    assert!(out.contains("(logger: 1 ready line"), "{out}");
}

#[test]
fn sweep_on_every_other_api_version() {
    for api in ["8", "9", "10", "12"] {
        pair("sweep", api, &["--max-bytes", "1M"], &[]);
    }
}

#[test]
fn sweep_over_ipv6_and_over_a_single_stream() {
    pair("sweep", "11", &["--max-bytes", "4M"], &[("WIRESPEED_SOCKET_FAMILY", "AF_INET6")]);
    let out = pair("sweep", "9", &["--max-bytes", "4M"], &[("WIRESPEED_NSTREAMS", "1"), ("WIRESPEED_CHUNK_BYTES", "65536")]);
    assert!(out.contains("WIRESPEED_NSTREAMS=1 WIRESPEED_CHUNK_BYTES=65536"), "{out}");
}

#[test]
fn request_limit_then_null_then_free_again() {
    pair("limit", "11", &[], &[]);
    pair("limit", "8", &[], &[]);
}

#[test]
fn a_message_larger_than_the_posted_buffer_is_an_error() {
    let out = pair("oversize", "8", &[], &[]);
    assert!(out.contains("failed with ncclResult 5"), "ncclInvalidUsage expected:\n{out}");
    pair("oversize", "12", &[], &[]);
}

#[test]
fn a_peer_killed_mid_transfer_fails_pending_requests_without_a_hang() {
    let out = pair("kill", "11", &[], &[]);
    assert!(out.contains("the receive failed with ncclResult 6"), "ncclRemoteError expected:\n{out}");
}

#[test]
fn closing_with_requests_in_flight() {
    let out = pair("close", "11", &[], &[]);
    assert!(out.contains("buffers untouched afterwards"), "{out}");
}

#[test]
fn init_fails_with_a_clear_reason() {
    let o = run(&["probe"], &[("WIRESPEED_NET_ALLOW_LOOPBACK", "0")]);
    assert!(!o.status.success());
    let out = text(&o);
    assert!(out.contains("init returned ncclResult 5") && out.contains("set WIRESPEED_NET_ALLOW_LOOPBACK=1"), "{out}");
    let o = run(&["probe", "--api", "8"], &[("WIRESPEED_NSTREAMS", "0")]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains("WIRESPEED_NSTREAMS=\"0\": give an integer from 1 to 64"), "{out}");
    let o = run(&["probe"], &[("WIRESPEED_IFNAME", "=no-such-if9")]);
    assert!(!o.status.success() && text(&o).contains("no usable network interface for WIRESPEED_IFNAME==no-such-if9"), "{}", text(&o));
}

#[test]
fn nccl_socket_ifname_is_the_fallback_interface_variable() {
    let o = run(&["probe"], &[("WIRESPEED_IFNAME", ""), ("NCCL_SOCKET_IFNAME", "=lo")]);
    let out = text(&o);
    assert!(o.status.success() && out.contains("interfaces NCCL_SOCKET_IFNAME==lo"), "{out}");
}

/// NCCL destroys a communicator as soon as its own operations completed, so a sender may close
/// while its last messages are still in the receiver's socket buffers: the receiver must still
/// get every one of them (a stream that ends between frames waits for its siblings).
#[test]
fn a_sender_closing_right_after_its_sends_complete_loses_nothing() {
    pair("early-close", "11", &[], &[]);
}

/// NCCL v11+ tells the plugin (setNetAttr, before each connect) how many peers and flows per peer
/// a communicator drives at once; the connection then opens its share of the streams, logged at
/// INFO once, unless WIRESPEED_NSTREAMS is set. The driver counts the established streams itself.
#[test]
fn nccls_hint_sets_the_streams_a_connection_opens() {
    // up to 2 flows to a peer share the default 12: 6 streams each, on both v11 and v12.
    for api in ["11", "12"] {
        let out = pair("attr", api, &["--max-bytes", "4M"], &[]);
        assert!(out.contains("NCCL's hint (1-2 peers x 1-2 flows) -> 6 streams per connection, as logged and as /proc/net/tcp counts"), "{out}");
        assert!(out.contains("NCCL's hint: send 1-2 peers x 1-2 flows, recv 1-2 peers x 1-2 flows, op * algo * proto *: 6 streams per connection (the listener's 12 shared among up to 2 connections to one peer at once)"), "{out}");
    }
    // WIRESPEED_NSTREAMS set: its count, whatever NCCL says, and the log says why.
    let out = pair("attr", "11", &["--max-bytes", "1M"], &[("WIRESPEED_NSTREAMS", "8")]);
    assert!(out.contains("-> 8 streams per connection, as logged and as /proc/net/tcp counts"), "{out}");
    assert!(out.contains("8 streams per connection (WIRESPEED_NSTREAMS=8 is set, so the hint changes nothing)"), "{out}");
    // Before v11 there is no setNetAttr to call.
    let o = run(&["pair", "--scenario", "attr", "--api", "10", "--timeout", "60"], &[]);
    assert!(!o.status.success() && text(&o).contains("needs API v11 or later"), "{}", text(&o));
}

#[test]
fn bad_numbers_are_one_line_errors_not_panics_or_wraps() {
    // A panic exits 101; a wrapped size ran a sweep of nothing and printed PASS.
    for (flag, value) in [("--timeout", "-1"), ("--timeout", "nan"), ("--timeout", "1e30"), ("--timeout", "0"),
                          ("--max-bytes", "17179869184G"), ("--max-bytes", "0"), ("--count", "0"),
                          ("--total", "99999999999999999999"), ("--msg", "12Q")] {
        let o = run(&["pair", "--scenario", "sweep", flag, value], &[]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {out}");
        assert_eq!(out.trim().lines().count(), 1, "{flag} {value}: {out}");
        assert!(out.starts_with("wirespeed-nccl-driver: ") && !out.contains("PASS"), "{flag} {value}: {out}");
    }
}
