import pytest

from wirespeed.errors import UsageError
from wirespeed.sizes import format_size, parse_size, sweep


@pytest.mark.parametrize("text,value", [("8", 8), ("32K", 32768), ("128M", 128 << 20), ("1G", 1 << 30),
                                        ("1g", 1 << 30), ("4KiB", 4096), ("0", 0), ("1.5K", 1536)])
def test_parse_size_binary_units(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12Q", "-4", "1.3"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_sweep_factor_and_step():
    assert sweep(8, 64, 2) == [8, 16, 32, 64]
    assert sweep(8, 100, 2) == [8, 16, 32, 64]
    assert sweep(0, 4, 2) == [0, 1, 2, 4]
    assert sweep(10, 40, stepbytes=10) == [10, 20, 30, 40]
    assert sweep(5, 5, 2) == [5]


def test_sweep_rejects_min_above_max_and_bad_steps():
    with pytest.raises(UsageError, match="larger than --maxbytes"):
        sweep(64, 8, 2)
    with pytest.raises(UsageError):
        sweep(8, 64, 1.0)
    with pytest.raises(UsageError):
        sweep(8, 64, stepbytes=0)


def test_format_size_round_trips():
    for n in (0, 7, 1024, 3 << 20, 5 << 30, 1536):
        assert parse_size(format_size(n)) == n


def test_sizes_from_flags_list_or_sweep():
    from wirespeed.flagvalues import Default
    from wirespeed.sizes import sizes_from_flags
    b, e, f = Default("8"), Default("64M"), Default("2")  # the flags' defaults, not given
    assert sizes_from_flags("4K, 1M", b, e, f) == [4096, 1 << 20]
    assert sizes_from_flags(None, "8", "64", "2") == [8, 16, 32, 64]
    assert sizes_from_flags(None, "10", "30", f, "10") == [10, 20, 30]
    for empty in (" , ", ""):
        with pytest.raises(UsageError, match="--sizes is empty"):
            sizes_from_flags(empty, b, e, f)
    with pytest.raises(UsageError, match="--stepfactor must be a number"):
        sizes_from_flags(None, "8", "64", "x")


def test_flags_that_would_be_ignored_are_refused():
    from wirespeed.flagvalues import Default
    from wirespeed.sizes import sizes_from_flags
    b, e, f = Default("8"), Default("64M"), Default("2")
    with pytest.raises(UsageError, match=r"-b/--minbytes would be ignored"):
        sizes_from_flags("4K", "1K", e, f)
    with pytest.raises(UsageError, match=r"-e/--maxbytes and -f/--stepfactor would be ignored"):
        sizes_from_flags("4K", b, "1M", "4")
    with pytest.raises(UsageError, match=r"-i/--stepbytes would be ignored"):
        sizes_from_flags("4K", b, e, f, "1K")
    with pytest.raises(UsageError, match="give one of them"):
        sizes_from_flags(None, b, e, "4", "1K")
    with pytest.raises(UsageError, match="does not parse"):
        sizes_from_flags(None, b, e, f, "")  # -i "" is not "no -i"
