"""`plan check` on hand-written plans and their mutants: each mutation a plan author makes by
mistake is caught, with the op at fault named (issue 24's done-when), and a right plan passes."""
import copy
import json

import pytest

from wirespeed.plans.check import check
from wirespeed.plans.format import PlanError, parse


def allreduce_2ranks(final_sync=True):
    """Two ranks, two chunks: each puts its input into the peer's scratch, signals, waits for the
    peer's put, reduces chunk by chunk into its output; then a last signal/wait so the next run's
    put cannot land in a scratch the peer is still reading."""
    def mem(typ, index, **kw):
        return {"type": typ, "index": index, "size": 1, **kw}

    def gpu(r):
        # ops 0 put, 1 nop, 2 signal, 3 wait, 4 nop, 5 re, 6 re, 7 nop, 8 signal, 9 wait: the
        # nops are the __syncthreads a GPU block needs between a data op and a signal, and
        # between a wait (done by one thread) and the ops that depend on it.
        ops = [
            {"name": "put", "src_buff": [{"type": "i", "index": 0, "size": 2}],
             "dst_buff": [{"buffer_id": 0, "index": 0, "size": 2}], "channel_type": "memory"},
            {"name": "nop"},
            {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
            {"name": "wait", "channel_ids": [0], "channel_type": "memory"},
            {"name": "nop"},
            {"name": "re", "src_buff": [mem("i", 0), mem("s", 0)], "dst_buff": [mem("o", 0)], "reduce_op": "sum"},
            {"name": "re", "src_buff": [mem("i", 1), mem("s", 1)], "dst_buff": [mem("o", 1)], "reduce_op": "sum"},
        ]
        if final_sync:
            ops += [{"name": "nop"}, {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
                    {"name": "wait", "channel_ids": [0], "channel_type": "memory"}]
        return {"id": r, "input_chunks": 2, "output_chunks": 2, "scratch_chunks": 2,
                "threadblocks": [{"id": 0, "ops": ops,
                                  "channels": [{"channel_type": "memory", "channel_ids": [0]}],
                                  "remote_buffer_refs": [{"access_channel_type": "memory",
                                                          "remote_buffer_ids": [0]}]}],
                "channels": [{"channel_type": "memory", "connected_to": [1 - r]}],
                "remote_buffers": [{"rank": 1 - r, "type": "s", "access_channel_types": ["memory"]}],
                "semaphores": []}
    return {"name": "ar2", "collective": "allreduce", "protocol": "Simple", "inplace": False,
            "reuse_resources": False, "use_double_scratch_buffer": False, "buffer_alignment": 16,
            "min_message_size": 0, "max_message_size": 2**64 - 1, "num_threads_per_block": 1024,
            "gpus": [gpu(0), gpu(1)]}


def ops_of(obj, rank):
    return obj["gpus"][rank]["threadblocks"][0]["ops"]


def test_the_right_plan_passes_with_every_chunk_right():
    r = check(parse(allreduce_2ranks()))
    assert r.ok, r.lines()
    assert not r.races and not r.between and not r.error
    assert len(r.chunks) == 2 * 2 * 2 and all(c.right for c in r.chunks)   # ranks x runs x chunks


def test_a_removed_signal_is_a_deadlock_naming_the_wait():
    obj = allreduce_2ranks()
    del ops_of(obj, 0)[2]                       # rank 0 never signals its put
    r = check(parse(obj))
    assert not r.ok and "deadlock" in r.error
    # Signals are counted: rank 1's first wait takes the one signal left, its last one starves.
    assert "rank 1, tb 0, op 9 (wait) (run 1) waits for a signal from rank 0" in r.error
    assert "rank 1 waits 2 time(s) per run on memory channel 0, rank 0 signals it 1 time(s)" in r.error


def test_a_removed_wait_is_a_race_naming_the_read():
    obj = allreduce_2ranks()
    del ops_of(obj, 1)[3]                       # rank 1 reduces without waiting for rank 0's put
    r = check(parse(obj))
    assert not r.ok
    kinds = {x.kind for x in r.races}
    assert "read-after-write" in kinds, r.lines()
    assert any("rank 1, tb 0, op 4 (re)" in x.second and "rank 0, tb 0, op 0 (put)" in x.first
               for x in r.races), r.lines()


def test_a_wait_moved_after_its_read_is_a_race():
    obj = allreduce_2ranks()
    ops = ops_of(obj, 1)
    ops.insert(5, ops.pop(3))                   # wait now after the first reduce
    r = check(parse(obj))
    assert not r.ok
    assert any("rank 1, tb 0, op 4 (re)" in x.second for x in r.races), r.lines()


@pytest.mark.parametrize("which, second", [(1, "(signal)"), (4, "(re)")])
def test_a_removed_nop_is_a_race_inside_the_thread_block(which, second):
    """Without the nop after the put, one GPU thread may signal before the others finished
    the copy; without the one after the wait, threads that did not wait reduce too early."""
    obj = allreduce_2ranks()
    del ops_of(obj, 0)[which]
    r = check(parse(obj))
    assert not r.ok, r.lines()
    assert r.races


def test_a_shifted_chunk_index_gives_a_wrong_result_that_says_where_it_came_from():
    obj = allreduce_2ranks()
    ops_of(obj, 0)[6]["src_buff"][1]["index"] = 0   # chunk 1 reduced with the peer's chunk 0
    r = check(parse(obj))
    assert not r.ok and not r.races and not r.error
    wrong = [c for c in r.chunks if not c.right]
    assert {(c.rank, c.chunk) for c in wrong} == {(0, 1)}
    assert "should hold the sum" in wrong[0].detail


def test_an_out_of_range_chunk_names_the_op():
    obj = allreduce_2ranks()
    ops_of(obj, 1)[5]["src_buff"][1]["index"] = 2   # scratch has chunks 0 and 1
    r = check(parse(obj))
    assert not r.ok and "rank 1, tb 0, op 5 (re)" in r.error and "past the buffer" in r.error


def test_without_a_final_sync_the_next_run_overtakes_the_peer():
    r = check(parse(allreduce_2ranks(final_sync=False)))
    assert r.between, r.lines()                 # run 2's put into a scratch run 1 still reads
    assert any(x.kind == "write-after-read" and "(put)" in x.second for x in r.between)
    assert r.ok                                 # a warning: right for one call
    assert not check(parse(allreduce_2ranks(final_sync=False)), strict=True).ok
    assert check(parse(allreduce_2ranks(final_sync=False)), runs=1).ok


@pytest.mark.parametrize("mutate, message", [
    (lambda o: ops_of(o, 0)[2].update(name="sgnal"), "unknown operation 'sgnal' (rank 0, tb 0, op 2)"),
    (lambda o: ops_of(o, 0)[2].update(flavour=1), "unknown field 'flavour'"),
    (lambda o: ops_of(o, 0)[2].update(channel_ids=[3]), "memory channel 3 is not among the thread block's 1"),
    (lambda o: ops_of(o, 0)[0]["dst_buff"][0].update(buffer_id=5), "remote buffer 5 is not among"),
    (lambda o: o.update(collective="allreduceX"), "unknown collective 'allreduceX'"),
    (lambda o: o["gpus"][1]["channels"][0].update(connected_to=[1]), "connected_to names rank 1"),
])
def test_what_the_reader_refuses_it_names(mutate, message):
    obj = allreduce_2ranks()
    mutate(obj)
    with pytest.raises(PlanError) as e:
        parse(obj, source="p.json")
    assert message in str(e.value)
    assert str(e.value).startswith("p.json: ")


def test_the_cli_exit_status_follows_the_verdict(tmp_path, run_cli):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(allreduce_2ranks()))
    obj = allreduce_2ranks()
    del ops_of(obj, 0)[2]
    bad.write_text(json.dumps(obj))
    out = run_cli("plan", "check", str(good), "--json", str(tmp_path / "v.jsonl"))
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout and "rank 1: 2 output chunk(s) right in every run" in out.stdout
    assert json.loads((tmp_path / "v.jsonl").read_text())["ok"] is True
    out = run_cli("plan", "check", str(good), str(bad))
    assert out.returncode == 1 and "deadlock" in out.stdout and "1 of 2 plans right" in out.stdout
    out = run_cli("plan", "check", str(good), "--ranks", "4")
    assert out.returncode == 2 and "has 2 ranks, --ranks says 4" in out.stderr
    (tmp_path / "junk.json").write_text("{")
    out = run_cli("plan", "check", str(tmp_path / "junk.json"))
    assert out.returncode == 2 and "not JSON" in out.stderr and "Traceback" not in out.stderr


def test_deepcopy_safety_of_the_fixture():
    a = allreduce_2ranks()
    b = copy.deepcopy(a)
    del ops_of(b, 0)[0]
    assert len(ops_of(a, 0)) == 10


FIXTURES = sorted((__import__("pathlib").Path(__file__).parent / "fixtures").glob("*.json"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_fixture_is_right_strictly(path):
    r = check(parse(json.loads(path.read_text()), source=path.name), strict=True)
    assert r.ok, "\n".join(r.lines())


def _first(obj, names, rank=None):
    """(rank, tb, index) of the first op named in `names` (pipelines not entered)."""
    for g in obj["gpus"]:
        if rank is not None and g["id"] != rank:
            continue
        for tb in g["threadblocks"]:
            for i, op in enumerate(tb["ops"]):
                if op["name"] in names:
                    return g["id"], tb["id"], i
    raise AssertionError(f"no {names} op")


MUTANTS = ["allreduce_ring_port_4r_2h", "allreduce_oneshot_ll_4r", "alltoall_direct_4r",
           "reducescatter_ring_port_4r_4h", "allgather_direct_4r", "allreduce_rsag_4r"]


@pytest.mark.parametrize("name", MUTANTS)
@pytest.mark.parametrize("mutation", ["drop-signal", "drop-wait", "shift-chunk", "rename-op"])
def test_mutants_of_the_fixtures_are_caught_with_the_op_named(name, mutation):
    obj = json.loads((FIXTURES[0].parent / f"{name}.json").read_text())
    if mutation == "rename-op":
        r, t, i = _first(obj, ("copy", "put", "re", "rre", "ppkt"))
        obj["gpus"][r]["threadblocks"][t]["ops"][i]["name"] = "putt"
        with pytest.raises(PlanError, match=rf"unknown operation 'putt' \(rank {r}, tb {t}, op {i}\)"):
            parse(obj)
        return
    if mutation == "drop-signal":
        if obj["protocol"] == "LL":
            pytest.skip("an LL plan's data needs no signal: its packets carry their flags")
        r, t, i = _first(obj, ("signal", "pws", "pwsf"), rank=1)
        op = obj["gpus"][r]["threadblocks"][t]["ops"][i]
        if op["name"] in ("pws", "pwsf"):
            op["name"] = "put"          # keep the data, drop its signal
        else:
            del obj["gpus"][r]["threadblocks"][t]["ops"][i]
        res = check(parse(obj))
        assert not res.ok and (res.error or res.races), res.lines()
        return
    if mutation == "drop-wait":
        # the wait that guards data: the first one whose block next (past nops) reads data
        if obj["protocol"] == "LL":
            pytest.skip("an LL plan's data needs no wait: its packets carry their flags")
        data = {"copy", "re", "rre", "rres", "res", "put", "pws", "pwsf", "get"}
        for tb in obj["gpus"][1]["threadblocks"]:
            ops = tb["ops"]
            for i, op in enumerate(ops):
                nxt = next((o for o in ops[i + 1:] if o["name"] != "nop"), None)
                if op["name"] == "wait" and nxt is not None and nxt["name"] in data and any(
                        b.get("type") == "s" or "buffer_id" in b for b in nxt.get("src_buff", [])):
                    del ops[i]
                    res = check(parse(obj))
                    assert not res.ok and (res.error or res.races), res.lines()
                    return
        # No op reads what arrives (puts straight into the output): the last wait guards the
        # host's read of the output after the run.
        ops = obj["gpus"][1]["threadblocks"][0]["ops"]
        last = max(i for i, o in enumerate(ops) if o["name"] == "wait")
        del ops[last]
        res = check(parse(obj), runs=1)
        assert not res.ok and (res.error or res.races), res.lines()
        return
    # shift-chunk: the first data op's local source moves one chunk over
    counts = {"i": "input_chunks", "o": "output_chunks", "s": "scratch_chunks"}
    for g in obj["gpus"]:
        for tb in g["threadblocks"]:
            for op in tb["ops"]:
                for ref in op.get("src_buff", [])[:1]:
                    if ref.get("type") in counts and "buffer_id" not in ref:
                        n = g[counts[ref["type"]]]
                        if ref["index"] + ref["size"] < n:
                            ref["index"] += 1
                        elif ref["index"] > 0:
                            ref["index"] -= 1
                        else:
                            continue
                        res = check(parse(obj))
                        assert not res.ok, res.lines()
                        return
    # no local source to shift: shift where the first put lands in its peer
    for g in obj["gpus"]:
        for tb in g["threadblocks"]:
            for op in tb["ops"]:
                for ref in op.get("dst_buff", [])[:1]:
                    if "buffer_id" in ref:
                        owner, typ = _remote(g, tb, op, ref)
                        n = obj["gpus"][owner][counts[typ]]
                        ref["index"] = ref["index"] + 1 if ref["index"] + ref["size"] < n else ref["index"] - 1
                        res = check(parse(obj))
                        assert not res.ok, res.lines()
                        return
    pytest.skip("nothing to shift")


def _remote(g, tb, op, ref):
    """(owner rank, buffer type) of a remote reference, through the block's refs."""
    ids = [i for rb in tb["remote_buffer_refs"] if rb["access_channel_type"] == op["channel_type"]
           for i in rb["remote_buffer_ids"]]
    rb = g["remote_buffers"][ids[ref["buffer_id"]]]
    return rb["rank"], rb["type"]


def test_wirespeeds_own_algorithms_check_by_name_at_any_rank_count(run_cli):
    out = run_cli("plan", "check", "wirespeed:allreduce-rsag", "wirespeed:allgather_ring_port",
                  "--ranks", "6", "--ranks-per-host", "3")
    assert out.returncode == 2 and "one-host plan" in out.stderr
    out = run_cli("plan", "check", "wirespeed:allreduce-rsag", "--ranks", "6")
    assert out.returncode == 0 and "6 ranks" in out.stdout and "OK" in out.stdout, out.stdout + out.stderr
    out = run_cli("plan", "check", "wirespeed:allgather_ring_port", "--ranks", "6", "--ranks-per-host", "3")
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr
    out = run_cli("plan", "check", "wirespeed:ring")
    assert out.returncode == 2 and "built in: allgather_direct" in out.stderr


def test_a_put_into_a_rank_its_channel_does_not_lead_to_is_named():
    """Rank 0 of a port ring puts into rank 3's output (a rank it has a channel to) through its
    channel to rank 1: the proxy would carry the bytes to the wrong host."""
    obj = json.loads((FIXTURES[0].parent / "allgather_ring_port_4r_4h.json").read_text())
    obj["gpus"][0]["remote_buffers"][0]["rank"] = 3
    r = check(parse(obj))
    assert not r.ok
    assert "puts into rank 3's output through port channel 0, which leads to rank 1" in r.error
    assert r.error.startswith("rank 0, tb 0, op ")
