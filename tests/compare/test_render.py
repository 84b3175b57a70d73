"""Tables, summary and plots of a comparison, from records (as saved runs hold them)."""
from wirespeed.compare import render
from wirespeed.compare.plot import plot_compare
from wirespeed.compare.stats import fold


def rec(backend, dtype, nbytes, time_us, inplace=True, repeat=0, wrong=0, world=2, device="cpu"):
    return {"collective": "all_reduce", "op": "sum", "backend": backend, "dtype": dtype,
            "device": device, "world_size": world, "bytes": nbytes, "count": nbytes // 4,
            "inplace": inplace, "time_us": time_us, "busbw_factor": 2 * (world - 1) / world,
            "algbw_gbps": 0.0, "busbw_gbps": 0.0, "wrong": wrong, "repeat": repeat}


def test_cells_take_the_faster_variant_and_the_median_over_repeats():
    records = [rec("mpi", "float32", 4096, t, inplace=False, repeat=i) for i, t in enumerate((10, 30, 11))]
    records += [rec("mpi", "float32", 4096, t, inplace=True, repeat=i) for i, t in enumerate((20, 21, 22))]
    cell = fold(records)[("all_reduce", "sum", "cpu", 2)][("mpi", "float32")][4096]
    assert (cell.time_us, cell.time_lo_us, cell.time_hi_us, cell.inplace) == (11, 10, 30, False)
    assert cell.repeats == 3 and abs(cell.spread - 20 / 11) < 1e-12
    assert abs(cell.busbw_gbps - 4096 / 11e-6 / 1e9) < 1e-9  # factor 2(n-1)/n = 1 at n = 2
    pinned = fold(records, "in-place")[("all_reduce", "sum", "cpu", 2)][("mpi", "float32")][4096]
    assert pinned.time_us == 21 and pinned.inplace


def test_table_marks_the_fastest_and_wrong_results_never_win():
    records = [rec("gloo", "float32", 4096, 50), rec("mpi", "float32", 4096, 10, wrong=3),
               rec("gloo", "float32", 65536, 90), rec("mpi", "float32", 65536, 30)]
    rows = {line.split()[0]: line for line in render.tables(records).splitlines()
            if line.strip() and not line.startswith("#")}
    assert "WRONG:3" in rows["4096"]
    assert rows["4096"].index("*") < rows["4096"].index("WRONG")  # the mark is on gloo's cell
    assert rows["65536"].rstrip().endswith("*")                     # and here on mpi's (last column)


def test_summary_names_winners_per_size_range_and_by_how_much():
    records = []
    for rep in range(3):
        for nbytes, g, m in ((4096, 40, 10), (8192, 44, 11), (16384, 60, 30), (1 << 20, 100, 300)):
            records += [rec("gloo", "float32", nbytes, g + rep, repeat=rep),
                        rec("mpi", "float32", nbytes, m + rep, repeat=rep)]
    text = render.summary(records)
    assert "4 KiB .. 16 KiB: mpi float32 fastest, 1.97x to 3.75x faster than the next (gloo float32)" in text
    assert "1 MiB: gloo float32 fastest, 2.98x faster than the next (mpi float32)" in text
    assert "within the spread" not in text and "--repeat" not in text


def test_overlapping_repeats_are_called_noise_not_a_win():
    records = []
    for rep, (g, m) in enumerate(((10, 12), (14, 9), (11, 15))):
        records += [rec("gloo", "float32", 4096, g, repeat=rep), rec("mpi", "float32", 4096, m, repeat=rep)]
    text = render.summary(records)
    assert "gloo float32 fastest" in text and "within the spread across repeats" in text
    assert "*~" in render.tables(records)
    single = render.summary([rec("gloo", "float32", 4096, 10), rec("mpi", "float32", 4096, 12)])
    assert "use --repeat" in single


def test_plots_have_a_panel_per_world_size(tmp_path):
    records = [rec(b, d, s, t * (1 + w), world=w) for b in ("gloo", "mpi") for d in ("float32", "float16")
               for w in (2, 4) for s, t in ((4096, 10), (65536, 40))]
    paths = plot_compare(records, tmp_path)
    assert [p.split("/")[-1] for p in paths] == ["compare_all_reduce_sum.png"]
    import matplotlib.image
    img = matplotlib.image.imread(paths[0])
    assert img.shape[1] > 1.8 * img.shape[0]  # two panels side by side
