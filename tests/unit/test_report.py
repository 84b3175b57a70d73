"""Renderers work on saved records alone (no torch, no ranks)."""
import json

import pytest

from wirespeed.errors import UsageError
from wirespeed.report.records import read_records, write_csv, write_jsonl
from wirespeed.report.table import footer, markdown_table, nccl_table


def _rec(nbytes, inplace, busbw, wrong=0, backend="gloo", run="r1"):
    return {"schema": "wirespeed.bench/1", "run_id": run, "collective": "all_reduce", "backend": backend,
            "dtype": "float32", "op": "sum", "device": "cpu", "world_size": 2, "root": -1,
            "bytes": nbytes, "count": nbytes // 4, "inplace": inplace, "time_us": 10.0,
            "algbw_gbps": busbw, "busbw_gbps": busbw, "busbw_factor": 1.0, "wrong": wrong,
            "checked": True}


def test_nccl_table_shows_both_variants_and_na():
    recs = [_rec(1024, True, 1.5), _rec(2048, True, 2.5), _rec(2048, False, 2.0)]
    text = nccl_table(recs)
    rows = [line for line in text.splitlines() if line.strip().startswith(("1024", "2048"))]
    assert len(rows) == 2
    assert "n/a" in rows[0] and "1.500" in rows[0]
    assert "2.000" in rows[1] and "2.500" in rows[1]


def test_footer_counts_wrong_and_fails():
    assert "0 OK" in footer([_rec(8, True, 1.0)])
    assert "3 FAILED" in footer([_rec(8, True, 1.0, wrong=3)])


def test_markdown_table_payload_busbw_algbw():
    md = markdown_table([_rec(1 << 20, True, 3.25)])
    assert "| payload | busbw | algbw |" in md
    assert "| 1 MiB | 3.250 GB/s | 3.250 GB/s |" in md


def test_records_round_trip_and_csv(tmp_path):
    recs = [_rec(1024, True, 1.0), _rec(2048, True, 2.0)]
    write_jsonl(tmp_path / "r.jsonl", recs)
    assert read_records(tmp_path / "r.jsonl") == recs
    assert read_records(tmp_path) == recs  # a run directory
    write_csv(tmp_path / "r.csv", recs)
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines[0].startswith("schema,run_id,collective,backend")
    assert len(lines) == 3


def test_read_records_rejects_foreign_files(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(UsageError, match="lacks"):
        read_records(tmp_path / "x.jsonl")
    (tmp_path / "y.jsonl").write_text("not json\n")
    with pytest.raises(UsageError, match="not a JSON line"):
        read_records(tmp_path / "y.jsonl")


def test_plot_writes_a_png(tmp_path):
    from wirespeed.report.plot import plot_records
    recs = [_rec(1 << k, True, k / 10) for k in range(10, 20)]
    recs += [_rec(1 << k, True, k / 20, backend="mpi", run="r2") for k in range(10, 20)]
    plot_records(recs, tmp_path / "p.png", title="t")
    data = (tmp_path / "p.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_table_adds_single_call_columns_on_request():
    r = dict(_rec(4096, True, 1.0), time_p50_us=12.25, time_p99_us=40.5)
    plain, wide = nccl_table([r]), nccl_table([r], per_op=True)
    assert "p50" not in plain and "12.25" not in plain
    head = [line for line in wide.splitlines() if "time" in line][0]
    assert head.count("p50") == 2 and head.count("p99") == 2  # out-of-place and in-place blocks
    row = [line for line in wide.splitlines() if line.strip().startswith("4096")][0]
    assert "12.25" in row and "40.50" in row
    # every row lines up with the header
    assert len({len(line) for line in wide.splitlines()[1:4] + [row]}) == 1


def test_plot_draws_every_record_kind(tmp_path):
    from wirespeed.report.plot import plot_records
    from wirespeed.report.records import kind
    bench = [_rec(1 << k, True, k / 10) for k in range(10, 16)]
    predicted = [dict(r, predicted=True, time_us=8.0, run_id="p") for r in bench]
    model = [{"schema": "wirespeed.model/1", "model": "resnet18", "strategy": s, "backend": "gloo",
              "world_size": 2, "time_us": t, "total_bytes": 1 << 20} for s, t in (("allreduce", 9e4),
                                                                                   ("sharded-ps", 3e5))]
    batching = [{"schema": "wirespeed.batching/1", "backend": "gloo", "world_size": 2,
                 "total_bytes": 1 << 20, "chunks": k, "time_us": 100.0 * k} for k in (1, 10, 100)]
    objects = [{"schema": "wirespeed.objects/1", "backend": "gloo", "world_size": n, "method": m,
                "time_us": t * n} for n in (2, 4) for m, t in (("all_gather_object", 80), ("all_reduce", 9))]
    tune = [{"schema": "wirespeed.tune/1", "backend": "wirespeed", "knobs": ["WIRESPEED_ALGO"],
             "setting": {}, "min_bytes": 1024, "max_bytes": 2048, "gain": 1.0}]
    recs = bench + predicted + model + batching + objects + tune
    assert [kind(r) for r in (bench[0], model[0], batching[0], objects[0], tune[0])] == \
        ["bench", "model", "batching", "objects", "tune"]
    drawn = plot_records(recs, tmp_path / "all.png")
    assert drawn == {"bench": 12, "model": 2, "batching": 3, "objects": 4}
    assert (tmp_path / "all.png").read_bytes()[:4] == b"\x89PNG"


def test_read_records_takes_workload_kinds_and_checks_their_fields(tmp_path):
    good = {"schema": "wirespeed.objects/1", "backend": "gloo", "world_size": 2, "method": "all_reduce",
            "time_us": 5.0}
    (tmp_path / "o.jsonl").write_text(json.dumps(good) + "\n")
    assert read_records(tmp_path / "o.jsonl") == [good]
    (tmp_path / "b.jsonl").write_text(json.dumps({"schema": "wirespeed.model/1", "model": "x"}) + "\n")
    with pytest.raises(UsageError, match="lacks strategy"):
        read_records(tmp_path / "b.jsonl")
