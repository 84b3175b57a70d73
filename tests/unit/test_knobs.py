"""The WIRESPEED_* namespace (knobs.py): core knobs are exactly what the native code reads, no
flag's environment twin is a core knob, and commands that start others pass the user's core
knobs on (WIRESPEED_NSTREAMS=4 wirespeed compare ... runs its benches with 4 streams)."""
import re
from pathlib import Path

from wirespeed.cli.main import build_parser
from wirespeed.compare.runner import child_env
from wirespeed.knobs import CORE, for_children, internal
from wirespeed.tune.knobs import KNOBS
from wirespeed.tune.sweep import Setting, setting_env

ROOT = Path(__file__).resolve().parents[2]
# Read by Python, not by the crates: the plugin's location, the job's identity (native/admission.py).
PYTHON_READ = {"WIRESPEED_NCCL_PLUGIN", "WIRESPEED_JOB_ID"}


def names_the_crates_read() -> set[str]:
    found = set()
    for f in (ROOT / "crates").rglob("*.rs"):
        if "tests" in f.parts or "driver" in f.parts:
            continue       # tests and the plugin's test driver set knobs; they do not define them
        found |= set(re.findall(r'"(WIRESPEED_[A-Z0-9_]+)"', f.read_text()))
    return found


def test_core_knobs_are_exactly_what_the_native_code_reads():
    assert names_the_crates_read() == set(CORE) - PYTHON_READ


def flag_twins():
    def walk(p, path):
        for a in p._actions:
            if getattr(a, "choices", None) and isinstance(a.choices, dict):
                for name, sub in a.choices.items():
                    yield from walk(sub, path + (name,))
            m = re.search(r"\[env (WIRESPEED_[A-Z0-9_]+)\]", a.help or "")
            if m:
                yield path, a.option_strings, m.group(1)
    return list(walk(build_parser(), ()))


def test_no_flag_twin_is_a_core_knob_unless_it_means_the_same():
    twins = flag_twins()
    assert len(twins) > 100, "the walk found the subcommands' flags"
    clashing = {(p, tuple(o), t) for p, o, t in twins if t in CORE}
    assert clashing == {(("launch",), ("--ifname",), "WIRESPEED_IFNAME")}
    assert ("predict",) in {p for p, o, t in twins if t == "WIRESPEED_PREDICT_ALGO"}


def test_children_keep_core_knobs_and_drop_twins_and_back_channels(monkeypatch):
    monkeypatch.setenv("WIRESPEED_NSTREAMS", "4")
    monkeypatch.setenv("WIRESPEED_IFNAME", "ws0")
    monkeypatch.setenv("WIRESPEED_PLOT", "x.png")           # bench's --plot twin
    monkeypatch.setenv(internal("CLUSTER"), "ws")
    env = child_env()
    assert env["WIRESPEED_NSTREAMS"] == "4" and env["WIRESPEED_IFNAME"] == "ws0"
    assert "WIRESPEED_PLOT" not in env and internal("CLUSTER") not in env
    # tune: the table's knobs go (its "default" row is the library default), the others stay
    swept = {k.name for k in KNOBS}
    assert "WIRESPEED_NSTREAMS" in swept
    env = setting_env(Setting())
    assert "WIRESPEED_NSTREAMS" not in env and env["WIRESPEED_IFNAME"] == "ws0" and "WIRESPEED_PLOT" not in env
    assert for_children({"WIRESPEED_ALGO": "ring", "PATH": "/bin"}) == {"WIRESPEED_ALGO": "ring", "PATH": "/bin"}
