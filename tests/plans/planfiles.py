"""Small execution plans written out as MSCCL++'s DSL writes them, for the executor's tests: an
all-reduce over memory channels, the same over LL packets, and a ring over port channels."""
from __future__ import annotations

import json

HEADER = {"reuse_resources": False, "num_threads_per_block": 1024, "buffer_alignment": 16,
          "min_message_size": 0, "max_message_size": 2**64 - 1}


def _ref(buf, index, size=1):
    return {"type": buf, "index": index, "size": size}


def _remote(k, index, size=1):
    return {"buffer_id": k, "index": index, "size": size}


def _slot(src: int, dst: int) -> int:
    """Where rank src's chunk lies in rank dst's scratch (one slot per other rank)."""
    return src if src < dst else src - 1


def allreduce_oneshot(n: int, packets: bool = False) -> dict:
    """Every rank puts its input into every peer's scratch, then sums its input and the n-1 slots.
    Simple: a relaxed handshake (the peers' last reads of scratch are done), puts, signal, wait;
    LL: packets (double scratch), whose flags order the reads, no signal at all."""
    gpus = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        slots = [_ref("s", k) for k in range(n - 1)]
        if packets:
            ops = [{"name": "ppkt", "src_buff": [_ref("i", 0)] * len(peers),
                    "dst_buff": [_remote(k, _slot(r, p)) for k, p in enumerate(peers)], "channel_type": "memory"},
                   {"name": "repkt", "src_buff": [_ref("i", 0), *slots], "dst_buff": [_ref("o", 0)],
                    "reduce_op": "sum"}]
            chans = []
        else:
            every = list(range(len(peers)))
            ops = [{"name": "rlxsignal", "channel_ids": every, "channel_type": "memory"},
                   {"name": "rlxwait", "channel_ids": every, "channel_type": "memory"},
                   {"name": "put", "src_buff": [_ref("i", 0)] * len(peers),
                    "dst_buff": [_remote(k, _slot(r, p)) for k, p in enumerate(peers)], "channel_type": "memory"},
                   {"name": "signal", "channel_ids": every, "channel_type": "memory"},
                   {"name": "wait", "channel_ids": every, "channel_type": "memory"},
                   {"name": "re", "src_buff": [_ref("i", 0), *slots], "dst_buff": [_ref("o", 0)],
                    "reduce_op": "sum"}]
            chans = [{"channel_type": "memory", "channel_ids": every}]
        gpus.append({"id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": n - 1,
                     "threadblocks": [{"id": 0, "ops": ops, "channels": chans, "remote_buffer_refs": [
                         {"access_channel_type": "memory", "remote_buffer_ids": list(range(len(peers)))}]}],
                     "channels": [{"channel_type": "memory", "connected_to": peers}],
                     "remote_buffers": [{"rank": p, "type": "s", "access_channel_types": ["memory"]} for p in peers],
                     "semaphores": []})
    name = f"allreduce_oneshot{'_ll' if packets else ''}_{n}r"
    return {"name": name, "collective": "allreduce", "protocol": "LL" if packets else "Simple",
            "inplace": True, "use_double_scratch_buffer": packets, **HEADER, "gpus": gpus}


def allgather_direct(n: int) -> dict:
    """In place: every rank puts its chunk (its slice of the output) into every peer's output."""
    gpus = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        every = list(range(len(peers)))
        ops = [{"name": "rlxsignal", "channel_ids": every, "channel_type": "memory"},
               {"name": "rlxwait", "channel_ids": every, "channel_type": "memory"},
               {"name": "put", "src_buff": [_ref("i", 0)] * len(peers),
                "dst_buff": [_remote(k, r) for k in every], "channel_type": "memory"},
               {"name": "signal", "channel_ids": every, "channel_type": "memory"},
               {"name": "wait", "channel_ids": every, "channel_type": "memory"}]
        gpus.append({"id": r, "input_chunks": 1, "output_chunks": n, "scratch_chunks": 0,
                     "threadblocks": [{"id": 0, "ops": ops,
                                       "channels": [{"channel_type": "memory", "channel_ids": every}],
                                       "remote_buffer_refs": [{"access_channel_type": "memory",
                                                               "remote_buffer_ids": every}]}],
                     "channels": [{"channel_type": "memory", "connected_to": peers}],
                     "remote_buffers": [{"rank": p, "type": "o", "access_channel_types": ["memory"]} for p in peers],
                     "semaphores": []})
    return {"name": f"allgather_direct_{n}r", "collective": "allgather", "protocol": "Simple", "inplace": True,
            "use_double_scratch_buffer": False, **HEADER, "gpus": gpus}


def allreduce_port_2r() -> dict:
    """Two ranks over port channels (a ring of two): each puts its half to the peer with a signal,
    sums the other half, puts the sum back, and copies the peer's sum into place."""
    gpus = []
    for r in range(2):
        mine, other = r, 1 - r
        tb0 = [{"name": "signal", "channel_ids": [0], "channel_type": "port"},
               {"name": "wait", "channel_ids": [0], "channel_type": "port"},
               {"name": "pwsf", "src_buff": [_ref("i", mine)], "dst_buff": [_remote(0, 0)], "channel_ids": [0],
                "channel_type": "port"},
               {"name": "wait", "channel_ids": [0], "channel_type": "port"},
               {"name": "re", "src_buff": [_ref("i", other), _ref("s", 0)], "dst_buff": [_ref("o", other)],
                "reduce_op": "sum"},
               {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}]
        tb1 = [{"name": "barrier", "barrier_id": 0, "num_threadblocks": 2},
               {"name": "pwsf", "src_buff": [_ref("o", other)], "dst_buff": [_remote(0, 1)], "channel_ids": [0],
                "channel_type": "port"},
               {"name": "wait", "channel_ids": [0], "channel_type": "port"},
               {"name": "copy", "src_buff": [_ref("s", 1)], "dst_buff": [_ref("o", mine)]}]
        refs = [{"access_channel_type": "port", "remote_buffer_ids": [0]}]
        gpus.append({"id": r, "input_chunks": 2, "output_chunks": 2, "scratch_chunks": 2,
                     "threadblocks": [
                         {"id": 0, "ops": tb0, "channels": [{"channel_type": "port", "channel_ids": [0]}],
                          "remote_buffer_refs": refs},
                         {"id": 1, "ops": tb1, "channels": [{"channel_type": "port", "channel_ids": [1]}],
                          "remote_buffer_refs": refs}],
                     "channels": [{"channel_type": "port", "connected_to": [1 - r, 1 - r]}],
                     "remote_buffers": [{"rank": 1 - r, "type": "s", "access_channel_types": ["port"]}],
                     "semaphores": []})
    return {"name": "allreduce_port_2r", "collective": "allreduce", "protocol": "Simple", "inplace": True,
            "use_double_scratch_buffer": False, **HEADER, "gpus": gpus}


def allreduce_port_ll_2r() -> dict:
    """Two ranks, LL over a port channel: each packs its input into packets in its scratch, the
    proxy carries them (flags and all) into the peer's scratch, each sums its input and the peer's
    packets once their flags are this run's. No signal at all."""
    gpus = []
    for r in range(2):
        ops = [{"name": "cpkt", "src_buff": [_ref("i", 0)], "dst_buff": [_ref("s", 0)]},
               {"name": "ppkt", "src_buff": [_ref("s", 0)], "dst_buff": [_remote(0, 1)], "channel_ids": [0],
                "channel_type": "port"},
               {"name": "repkt", "src_buff": [_ref("i", 0), _ref("s", 1)], "dst_buff": [_ref("o", 0)],
                "reduce_op": "sum"}]
        gpus.append({"id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 2,
                     "threadblocks": [{"id": 0, "ops": ops,
                                       "channels": [{"channel_type": "port", "channel_ids": [0]}],
                                       "remote_buffer_refs": [{"access_channel_type": "port",
                                                               "remote_buffer_ids": [0]}]}],
                     "channels": [{"channel_type": "port", "connected_to": [1 - r]}],
                     "remote_buffers": [{"rank": 1 - r, "type": "s", "access_channel_types": ["port"]}],
                     "semaphores": []})
    return {"name": "allreduce_port_ll_2r", "collective": "allreduce", "protocol": "LL", "inplace": True,
            "use_double_scratch_buffer": True, **HEADER, "gpus": gpus}


def write(path, plan: dict) -> str:
    with open(path, "w") as f:
        json.dump(plan, f)
    return str(path)
