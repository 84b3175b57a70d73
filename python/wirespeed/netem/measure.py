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
    return tcp_throughput_many([(src_ns, dst_ns, dst_addr)], streams, seconds)[0]


def tcp_throughput_many(pairs: list[tuple[str, str, str]], streams: int = 1,
                        seconds: float = 1.0) -> list[float]:
    """Bits per second per (src_ns, dst_ns, dst_addr) pair, every pair's `streams` flows sending
    at once: what links carry while other hosts load the machine and the switch too."""
    stop = threading.Event()
    probes = [_Probe(src, dst, addr, streams, seconds, stop) for src, dst, addr in pairs]
    for p in probes:
        p.start_receiver()
    for p in probes:
        p.start_sender()
    time.sleep(WARM_S)
    # Each count is read at some instant between two clock readings; timing from the earlier
    # reading at the start to the later one at the end can only make the interval longer, so a
    # descheduled probe (a busy machine) reads low, never above the cap.
    t0 = time.monotonic()
    b0 = [sum(p.counts) for p in probes]
    time.sleep(seconds)
    b1 = [sum(p.counts) for p in probes]
    t1 = time.monotonic()
    stop.set()
    for p in probes:
        p.join()
    out = []
    for p, x0, x1 in zip(probes, b0, b1):
        for box in (p.sbox, p.rbox):
            if "error" in box:
                raise NetemError(f"throughput probe {p.src_ns} -> {p.dst_ns} failed: {box['error']}")
        if x1 == x0:
            raise NetemError(f"throughput probe {p.src_ns} -> {p.dst_ns}: no data arrived")
        out.append((x1 - x0) * 8 / (t1 - t0))
    return out


class _Probe:
    """One pair's flows: a receiver thread in dst_ns, a sender thread in src_ns."""

    def __init__(self, src_ns, dst_ns, dst_addr, streams, seconds, stop):
        self.src_ns, self.dst_ns, self.dst_addr = src_ns, dst_ns, dst_addr
        self.streams, self.seconds, self.stop = streams, seconds, stop
        self.counts = [0] * streams
        self.listener_box: dict = {}
        self.ready = threading.Event()

    def start_receiver(self):
        self.rt, self.rbox = run_in_netns(self.dst_ns, self.receiver)
        if not self.ready.wait(5):
            raise NetemError(f"throughput probe: could not listen in {self.dst_ns}: {self.rbox.get('error')}")

    def start_sender(self):
        self.st, self.sbox = run_in_netns(self.src_ns, self.sender)

    def join(self):
        self.st.join(5)
        self.rt.join(5)

    def receiver(self):
        streams, seconds = self.streams, self.seconds
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.settimeout(5)
        ls.bind((self.dst_addr, 0))
        ls.listen(streams)
        self.listener_box["port"] = ls.getsockname()[1]
        self.ready.set()
        conns = []
        try:
            for _ in range(streams):
                c, _ = ls.accept()
                c.settimeout(2)
                conns.append(c)
        finally:
            ls.close()
        threads = [threading.Thread(target=self._drain, args=(c, i), daemon=True) for i, c in enumerate(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + WARM_S + 5)

    def _drain(self, conn, i):
        buf = bytearray(CHUNK)
        try:
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    return
                self.counts[i] += n
        except OSError:
            return
        finally:
            conn.close()

    def sender(self):
        self.ready.wait(5)
        if "port" not in self.listener_box:
            raise NetemError("throughput probe: the receiver did not start")
        socks = []
        for _ in range(self.streams):
            s = socket.create_connection((self.dst_addr, self.listener_box["port"]), timeout=5)
            socks.append(s)
        payload = bytes(CHUNK)
        stop = self.stop

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
            t.join(self.seconds + WARM_S + 5)
