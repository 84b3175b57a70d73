"""The house's layers hold: no import circle between Python modules of the package (imports at
module level and inside functions both count), no import from a lower layer into a higher one, and
no circle between the Rust core's top-level modules, whose files stay readable; cli/ only parses (docs/architecture.md
draws the layers)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "wirespeed"
CORE = ROOT / "crates" / "wirespeed-core" / "src"

# package -> packages it may never import (lower layers do not reach up)
FORBIDDEN = {
    "launch": {"backends", "bench", "cli", "compare", "tune", "workloads", "explain", "native", "train"},
    "report": {"backends", "bench", "cli", "compare", "tune", "workloads", "launch", "native", "netem",
               "train"},
    "backends": {"bench", "cli", "compare", "tune", "workloads", "explain", "train"},
    "native": {"backends", "bench", "cli", "compare", "launch", "tune", "workloads", "train"},
    "bench": {"cli", "compare", "tune", "workloads", "train"},
    "netem": {"backends", "bench", "cli", "compare", "tune", "workloads", "native", "train"},
    # MSCCL++ plans: read, checked, simulated by themselves; executed over the native engine; the
    # harness (bench) and the CLI use them, never the other way round.
    "plans": {"backends", "bench", "cli", "compare", "tune", "workloads", "explain", "launch", "report",
              "netem", "train"},
    # `wirespeed train`'s home: a workload over launch/, backends/, bench/ and explain/; cli/ only
    # parses its flags and hands over, and no other command's package reaches into it.
    "train": {"cli", "compare", "tune"},
    "workloads": {"cli", "train"},
    "explain": {"cli", "train"},
}


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = ["wirespeed", *f.relative_to(PKG).with_suffix("").parts]
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (f, pkg)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    graph = {}
    for m, (f, is_pkg) in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [f"{module}.{a.name}" for a in node.names] + [module]
            for t in targets:
                if t.startswith("wirespeed"):
                    o = owner(t)
                    if o and o != m:
                        deps.add(o)
        graph[m] = {d for d in deps if not m.startswith(d + ".")}   # a package's own __init__ is no circle
    return graph


def circles(graph) -> list[list[str]]:
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    graph = import_graph()
    assert len(graph) > 80 and graph["wirespeed.native.registration"] >= {"wirespeed.native.backend"}
    assert circles(graph) == []


def test_no_package_imports_a_higher_layer():
    def package(m):
        return m.split(".")[1] if m.count(".") >= 1 else ""
    bad = sorted((m, d) for m, ds in import_graph().items() for d in ds
                 if package(d) in FORBIDDEN.get(package(m), ()))
    assert bad == []
    # and no two packages import each other
    pairs = {(package(m), package(d)) for m, ds in import_graph().items() for d in ds if package(m) != package(d)}
    assert sorted((a, b) for a, b in pairs if (b, a) in pairs and a < b) == []


# cli/ only parses and hands over: each command's work lives in its own package (bench/run.py,
# train/, workloads/, explain/links_rank.py, launch/remote.py), so no cli file grows past this.
CLI_FILE_LINES = 250
CLI_TOTAL_LINES = 2300


def test_cli_only_parses_and_hands_over():
    lines = {f.name: len(f.read_text().splitlines()) for f in (PKG / "cli").glob("*.py")}
    assert {f: n for f, n in lines.items() if n > CLI_FILE_LINES} == {}
    assert sum(lines.values()) < CLI_TOTAL_LINES, sum(lines.values())


def core_graph() -> dict[str, set[str]]:
    """Top-level module of the core (a file or folder under src/) -> the others its code names
    through `crate::` paths (comments left out)."""
    top = {p.stem for p in CORE.glob("*.rs") if p.stem != "lib"} | {p.name for p in CORE.iterdir() if p.is_dir()}
    graph = {m: set() for m in top}
    for f in CORE.rglob("*.rs"):
        rel = f.relative_to(CORE).parts
        me = rel[0] if len(rel) > 1 else f.stem
        if me == "lib":
            continue
        code = "\n".join(line.split("//")[0] for line in f.read_text().splitlines())
        for used in re.findall(r"\bcrate::(\w+)", code):
            if used in top and used != me:
                graph[me].add(used)
        # `use crate::{a, b::c}` groups
        for group in re.findall(r"\bcrate::\{([^}]*)\}", code):
            for used in re.findall(r"(?:^|,)\s*(\w+)", group):
                if used in top and used != me:
                    graph[me].add(used)
    return graph


def test_no_circle_between_the_cores_modules():
    graph = core_graph()
    assert {"engine", "shm", "hosts", "transport", "algo", "api"} <= set(graph)
    assert graph["hosts"] >= {"shm", "transport"}, graph["hosts"]
    assert circles(graph) == []


def test_the_cores_files_stay_readable_and_one_name_means_one_thing():
    long = {str(f.relative_to(CORE)): n for f in CORE.rglob("*.rs")
            if (n := len(f.read_text().splitlines())) > 800}
    assert long == {}
    assert [str(f.relative_to(CORE)) for f in CORE.rglob("tcp.rs")] == []


def test_the_core_reads_the_environment_in_one_module():
    readers = sorted(str(f.relative_to(CORE)) for f in CORE.rglob("*.rs") if "env::var" in f.read_text())
    assert readers == ["config.rs"]
