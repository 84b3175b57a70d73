"""The job's rendezvous for torch.distributed backends, with a roll call: within the timeout, every
rank either meets all the others or says exactly which ranks never came.

torch's own tcp:// rendezvous, given a WORLD_SIZE larger than the ranks started, ends only after
retries of its timeout, with its socket warnings as the only explanation. Here rank 0 (or
torchrun's agent) serves a TCPStore; every rank first waits for that store to accept connections,
then checks in under its rank and waits for the others' check-ins, all before one shared deadline.
The store is then handed to init_process_group, so the backend rendezvouses through it as usual.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from contextlib import contextmanager

from ..errors import PeerLost, PeerTimeout
from ..faults import first_line
from .base import RankInfo


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _wait_listening(addr: str, port: int, deadline: float) -> bool:
    """True once something accepts TCP connections at addr:port (plain connects, which a TCPStore
    server drops silently, where a TCPStore client prints a stack per failed try)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            with socket.create_connection((addr, port), timeout=min(left, 1.0)):
                return True
        except OSError:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))


# torch's TCPStore client does not keep to its timeout: it retries a refused connect with a
# backoff it does not clip (given 10 s it gave up after 17 s, given 5 s after 8 s), and against a
# server that accepts but never answers (its rank stopped, or another program on the port) it
# waits forever. So it runs in a thread of its own, and the rank waits for it only until the
# roll call's deadline, looking meanwhile whether the server is still there.
CHECK_S = 0.25


def _connect(info: RankInfo, deadline: float, timeout_s: float, serving: str):
    """A client of the store that answered at the rendezvous, within the roll call's deadline.
    The store accepted a connection a moment ago, so a refused one now means the process serving
    it has gone (killed, or failed in its own setup): a lost peer, said at once rather than after
    the timeout (the soak: rank 0 killed in setup, its peers ended 13-20 s later with torch's
    text). A store that accepts but does not answer is a timeout, at the deadline."""
    import threading

    import torch.distributed as dist

    where = f"{info.master_addr}:{info.master_port}"
    box: dict = {}

    def attempt():
        try:
            box["store"] = dist.TCPStore(
                info.master_addr, info.master_port, info.world_size, is_master=False,
                timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)),
                wait_for_workers=False)
        except Exception as e:  # noqa: BLE001 (torch's DistNetworkError, or its RuntimeError)
            box["error"] = e

    gone = False
    with _quiet_stderr():
        t = threading.Thread(target=attempt, name="wirespeed-store-connect", daemon=True)
        t.start()
        while t.is_alive() and time.monotonic() < deadline:
            t.join(min(CHECK_S, max(deadline - time.monotonic(), 0)))
            if t.is_alive() and _refused(info.master_addr, info.master_port):
                gone = True
                break
    if "store" in box:
        # Its calls in the roll call get what remains of the deadline, as the master's do.
        box["store"].set_timeout(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        return box["store"]
    if gone or ("error" in box and _refused(info.master_addr, info.master_port)):
        raise PeerLost(f"rank {info.rank}: {serving}, which served the rendezvous at {where}, "
                       "stopped answering before every rank had checked in (it died or failed; "
                       "its own output says which)")
    why = first_line(box["error"]) if "error" in box else "it accepted the connection but never answered"
    raise PeerTimeout(f"rank {info.rank}: {serving} at the rendezvous {where} did not take this rank "
                      f"within {timeout_s:g} s: {why}")


def _refused(addr: str, port: int) -> bool:
    """True when nothing listens at addr:port any more (the connection is refused). Silence is
    not a refusal: a busy server's full backlog, or a link that is down."""
    try:
        with socket.create_connection((addr, port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


@contextmanager
def _quiet_stderr():
    """fd 2 to /dev/null while a rank connects to the store: torch's client logs every failed
    try with a C++ stack there, and the failure is reported in one line of ours. No other thread
    of the rank writes yet (the rendezvous precedes the watchdog)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def roll_call_store(info: RankInfo, timeout_s: float):
    """A TCPStore every rank of the job has checked in to, or PeerTimeout naming who is missing."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    where = f"{info.master_addr}:{info.master_port}"
    # Under torchrun its agent serves the store on MASTER_PORT and every rank is a client.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    master = info.rank == 0 and not agent
    if not master and not _wait_listening(info.master_addr, info.master_port, deadline):
        serving = "torchrun's agent" if agent else "rank 0"
        raise PeerTimeout(f"rank {info.rank}: nothing answered at the rendezvous {where} within "
                          f"{timeout_s:g} s: {serving} never started there (start it, or point "
                          "MASTER_ADDR/MASTER_PORT at it)")
    if master:
        left = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        store = dist.TCPStore(info.master_addr, info.master_port, info.world_size, is_master=True,
                              timeout=left, wait_for_workers=False)
    else:
        store = _connect(info, deadline, timeout_s, "torchrun's agent" if agent else "rank 0")
    # A restarted torchrun job reuses its agent's store: keys of an earlier attempt must not count.
    prefix = f"wirespeed/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    keys = [f"{prefix}arrived/{r}" for r in range(info.world_size)]
    try:
        if master:  # one deadline for all, so no rank outwaits the store it polls
            store.set(f"{prefix}deadline", repr(time.time() + (deadline - time.monotonic())))
        store.set(keys[info.rank], str(os.getpid()))
        synced = master
        # Polled with check() rather than a blocking wait(), whose timeout torch reports with
        # socket warnings on stderr before it raises.
        missing = list(range(info.world_size))
        while True:
            if not synced and store.check([f"{prefix}deadline"]):
                shared = float(store.get(f"{prefix}deadline")) - time.time()
                deadline, synced = min(deadline, time.monotonic() + shared), True
            missing = [r for r in missing if not store.check([keys[r]])]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if missing:
            store.set(f"{prefix}gave-up/{info.rank}", "1")
            if master:  # keep serving until the others have read their verdict
                _linger(store, [f"{prefix}gave-up/{r}" for r in range(info.world_size)
                                if r not in missing and r != info.rank])
    except Exception as e:  # noqa: BLE001 (the store itself went away: its rank ended)
        raise PeerLost(f"rank {info.rank}: the rendezvous at {where} went away while ranks were "
                       f"still arriving (the rank serving it ended): {first_line(e)}") from None
    if missing:
        came = [r for r in range(info.world_size) if r not in missing]
        raise PeerTimeout(f"rank {info.rank}: {_ranks(missing)} never joined the job within "
                          f"{timeout_s:g} s (WORLD_SIZE={info.world_size}, rendezvous {where}; "
                          f"joined: {', '.join(map(str, came))}): start every rank, or set "
                          "WORLD_SIZE to the number of ranks started")
    # The store's own timeout was what remained of the roll call's; its later users (the
    # backend's rendezvous) get the whole timeout again.
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    return store


def _linger(store, keys: list[str], most_s: float = 2.0) -> None:
    end = time.monotonic() + most_s
    while keys and time.monotonic() < end:
        keys = [k for k in keys if not store.check([k])]
        time.sleep(0.02)
