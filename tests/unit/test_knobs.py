"""The WIRESPEED_* namespace (knobs.py): core knobs are exactly what the native code reads, few files
touch the variables in the environment by name (every name said in knobs.py), no
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


# The files that may touch a WIRESPEED_* variable in the process environment by name: the one reader
# of launchers and back-channels, the --host-per-rank host ids, the NCCL plugin's location, and the
# native group's setup (which hands native/admission.py the job's identity and secret). Everywhere else a name comes from knobs.py (internal(), twin()) or
# launch/environment.py (spawned_here, link_fields, ...), and no Python code configures the core by
# writing its own environment.
ENV_TOUCHERS = {
    "launch/environment.py", "launch/gpus.py", "netplugin.py", "native/rendezvous.py",
}
# A full variable name (or the bare prefix from which one is built), as a string or a keyword.
NAME = re.compile(r"_?WIRESPEED_[A-Z0-9_]*")


def touches_wirespeed_environment(source: str) -> bool:
    """A file that uses the process environment (os.environ, os.getenv, an `environ` passed in)
    and names a WIRESPEED_* or _WIRESPEED_* variable literally."""
    import ast
    tree = ast.parse(source)
    uses_env = any((isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv", "putenv", "unsetenv"))
                   or (isinstance(n, ast.Name) and n.id == "environ")
                   or (isinstance(n, ast.arg) and n.arg == "environ")
                   for n in ast.walk(tree))
    names = any((isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value))
                or (isinstance(n, ast.keyword) and n.arg and NAME.fullmatch(n.arg))
                for n in ast.walk(tree))
    return uses_env and names


def test_few_files_touch_wirespeed_variables_in_the_environment():
    pkg = ROOT / "python" / "wirespeed"
    found = {str(f.relative_to(pkg)) for f in pkg.rglob("*.py") if touches_wirespeed_environment(f.read_text())}
    assert found <= ENV_TOUCHERS, sorted(found - ENV_TOUCHERS)
    assert len(found) <= 4, sorted(found)
    # the check itself sees a literal read, a write through a keyword, and a name built from the prefix
    assert touches_wirespeed_environment('import os\nos.environ.get("_WIRESPEED_LOCAL_SPAWN")')
    assert touches_wirespeed_environment('def f(environ):\n    environ.update(_WIRESPEED_CLUSTER="ws")')
    assert touches_wirespeed_environment('import os\nos.environ["WIRESPEED_" + "X"]')
    assert not touches_wirespeed_environment('import os\nos.environ.get(internal("CLUSTER"))')


def test_every_name_is_said_in_knobs():
    from wirespeed.knobs import BACK_CHANNELS, DIAGNOSTIC, twin
    import pytest
    with pytest.raises(KeyError):
        internal("NO_SUCH_CHANNEL")
    assert twin("--max-bytes") == "WIRESPEED_MAX_BYTES"
    assert set(DIAGNOSTIC).isdisjoint(CORE) and "LOCAL_SPAWN" in BACK_CHANNELS
    pkg = ROOT / "python" / "wirespeed"
    used = set()
    for f in pkg.rglob("*.py"):
        used |= set(re.findall(r'"(_?WIRESPEED_[A-Z0-9_]+)"', f.read_text()))
    # every full name Python reads is a core knob, a diagnostic or a back-channel; the others
    # are flag twins given explicitly (add(..., twin=...))
    twins = {"WIRESPEED_PLAN_SIZES", "WIRESPEED_PREDICT_ALGO"}
    assert used - set(CORE) - set(DIAGNOSTIC) - twins == set(), sorted(used - set(CORE) - set(DIAGNOSTIC) - twins)
