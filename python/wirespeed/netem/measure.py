"""Measure what a capped link really carries: a short, bounded TCP transfer between two namespaces.

Sender and receiver are threads of this process, each inside its own namespace (see ns.run_in_netns),
so a measurement costs no interpreter start-up and leaves no process behind. The first WARM_S seconds
are not counted: TCP's slow start and htb's initial burst are not the steady rate a job sees.
"""
from __future__ import annotations

import socket
import threading
import time

from .ns import NetemError, run_in_netns

WARM_S = 0.3
CHUNK = 1 << 20


def tcp_throughput(src_ns: str, dst_ns: str, dst_addr: str, streams: int = 1,
                   seconds: float = 1.0) -> float:
    """Bits per second that `streams` parallel TCP flows carry from src_ns to dst_addr in dst_ns."""
    stop = threading.Event()
    counts = [0] * streams
    listener_box: dict = {}
    ready = threading.Event()

    def receiver():
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.settimeout(5)
        ls.bind((dst_addr, 0))
        ls.listen(streams)
        listener_box["port"] = ls.getsockname()[1]
        ready.set()
        conns = []
        try:
            for _ in range(streams):
                c, _ = ls.accept()
                c.settimeout(2)
                conns.append(c)
        finally:
            ls.close()
        threads = [threading.Thread(target=_drain, args=(c, i), daemon=True) for i, c in enumerate(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + WARM_S + 5)

    def _drain(conn, i):
        buf = bytearray(CHUNK)
        try:
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    return
                counts[i] += n
        except OSError:
            return
        finally:
            conn.close()

    def sender():
        ready.wait(5)
        if "port" not in listener_box:
            raise NetemError("throughput probe: the receiver did not start")
        socks = []
        for _ in range(streams):
            s = socket.create_connection((dst_addr, listener_box["port"]), timeout=5)
            socks.append(s)
        payload = bytes(CHUNK)

        def push(s):
            try:
                while not stop.is_set():
                    s.sendall(payload)
            except OSError:
                pass
            finally:
                s.close()
        threads = [threading.Thread(target=push, args=(s,), daemon=True) for s in socks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + WARM_S + 5)

    rt, rbox = run_in_netns(dst_ns, receiver)
    if not ready.wait(5):
        raise NetemError(f"throughput probe: could not listen in {dst_ns}: {rbox.get('error')}")
    st, sbox = run_in_netns(src_ns, sender)
    time.sleep(WARM_S)
    # Each count is read at some instant between two clock readings; timing from the earlier
    # reading at the start to the later one at the end can only make the interval longer, so a
    # descheduled probe (a busy machine) reads low, never above the cap.
    t0 = time.monotonic()
    b0 = sum(counts)
    time.sleep(seconds)
    b1 = sum(counts)
    t1 = time.monotonic()
    stop.set()
    st.join(5)
    rt.join(5)
    for box in (sbox, rbox):
        if "error" in box:
            raise NetemError(f"throughput probe {src_ns} -> {dst_ns} failed: {box['error']}")
    if b1 == b0:
        raise NetemError(f"throughput probe {src_ns} -> {dst_ns}: no data arrived")
    return (b1 - b0) * 8 / (t1 - t0)
