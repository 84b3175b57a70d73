"""Plans for the executor's tests: the writer's committed fixtures by name, and one written here
by hand that the writer does not make (LL packets over a port channel)."""
from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

HEADER = {"reuse_resources": False, "num_threads_per_block": 1024, "buffer_alignment": 16,
          "min_message_size": 0, "max_message_size": 2**64 - 1}


def _ref(buf, index, size=1):
    return {"type": buf, "index": index, "size": size}


def _remote(k, index, size=1):
    return {"buffer_id": k, "index": index, "size": size}


def fixture(name: str) -> dict:
    """One of the committed plans wirespeed's writer made (tests/plans/fixtures/NAME.json)."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


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
