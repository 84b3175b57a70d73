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
