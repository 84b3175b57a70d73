"""A rank connecting to the rendezvous's store ends within the timeout whatever the store does.

Found by the soak (benchmarks/soak.py): rank 0 killed in setup on 2 emulated hosts left its peers
in torch's TCPStore client, which overshoots its timeout (10 s given, 13-20 s taken) and ends
with a C++ stack per try and torch's text; a store that accepts but never answers kept it
forever. A store gone after it answered is a lost peer, said at once; a silent one is a timeout
at the deadline."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from wirespeed.backends.rendezvous import roll_call_store
from wirespeed.errors import PeerLost, PeerTimeout
from wirespeed.launch.environment import RankInfo


@pytest.mark.timeout(60)
def test_a_store_gone_after_answering_is_a_lost_peer_at_once(capfd):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    def answer_once_then_die():
        conn, _ = listener.accept()   # the rank's "is anything there" probe
        conn.close()
        listener.close()              # rank 0 killed: nothing listens any more

    t = threading.Thread(target=answer_once_then_die)
    t.start()
    info = RankInfo(rank=1, world_size=2, local_rank=1, local_world_size=2,
                    master_addr="127.0.0.1", master_port=port)
    timeout_s = 5.0
    began = time.monotonic()
    with pytest.raises(PeerLost, match=r"rank 1: rank 0, which served the rendezvous at "
                                       rf"127\.0\.0\.1:{port}, stopped answering"):
        roll_call_store(info, timeout_s)
    took = time.monotonic() - began
    t.join(5)
    assert took < 2.0, took   # not the timeout (5 s), nor torch's overshoot of it (8 s)
    assert capfd.readouterr().err == ""   # no C++ stack of torch's failed tries


@pytest.mark.timeout(60)
def test_a_store_that_accepts_but_never_answers_times_out_at_the_deadline(capfd):
    """Its rank stopped: the kernel still accepts connections for it, nothing answers them.
    torch's client waited for an answer forever (its timeout is not applied to it)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    info = RankInfo(rank=1, world_size=2, local_rank=1, local_world_size=2,
                    master_addr="127.0.0.1", master_port=port)
    timeout_s = 4.0
    began = time.monotonic()
    try:
        with pytest.raises(PeerTimeout, match=rf"rank 1: rank 0 at the rendezvous 127\.0\.0\.1:{port} "
                                              r"did not take this rank within 4 s"):
            roll_call_store(info, timeout_s)
    finally:
        listener.close()
    took = time.monotonic() - began
    assert timeout_s - 0.1 < took < timeout_s + 0.5, took   # torch's own wait took 6-7 s
    assert capfd.readouterr().err == ""
