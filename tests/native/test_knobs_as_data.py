"""The core's knobs cross into the native module as data: `Group(..., knobs=...)` and
`fd_room(knobs)` read them before the environment (crates/wirespeed-core/src/config.rs,
`knobs_over_env`), so no Python code configures the core by writing its own environment."""
import pytest

_native = pytest.importorskip("wirespeed._native")


def test_fd_room_reads_given_knobs_before_the_environment(monkeypatch):
    monkeypatch.setenv("WIRESPEED_NSTREAMS", "5")
    assert _native.fd_room().startswith("5:")
    assert _native.fd_room({"WIRESPEED_NSTREAMS": "3"}).startswith("3:")
    assert _native.fd_room({}).startswith("5:")


def test_a_group_reads_its_knobs_and_refuses_a_bad_one():
    token = _native.random_token()
    with pytest.raises(_native.UnsupportedError, match="WIRESPEED_ALGO"):
        _native.Group(0, 1, token, 5.0, None, None, {"WIRESPEED_ALGO": "no-such-algorithm"})
    assert _native.Group(0, 1, token, 5.0, knobs={"WIRESPEED_ALGO": "auto"}).world == 1


@pytest.mark.parametrize("knob,value,says", [
    ("WIRESPEED_CONNECT", "sometimes", "is not a connection mode"),
    ("WIRESPEED_NSTREAMS", "0", "give an integer from 1 to 64"),
])
def test_a_one_host_group_refuses_an_engine_knob_set_wrong(knob, value, says):
    # Only a group across hosts uses them, but a value set wrong is refused on every host (482a6d1
    # took it silently on one host, and refused it the day the job spanned two).
    with pytest.raises(_native.UnsupportedError, match=says):
        _native.Group(0, 1, _native.random_token(), 5.0, None, None, {knob: value})
