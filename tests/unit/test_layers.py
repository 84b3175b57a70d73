"""The house's layers hold: no import circle between Python modules of the package (imports at
module level and inside functions both count), and no import from a lower layer into a higher one
(docs/architecture.md draws the layers)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "python" / "wirespeed"

# package -> packages it may never import (lower layers do not reach up)
FORBIDDEN = {
    "launch": {"backends", "bench", "cli", "compare", "tune", "workloads", "explain", "native"},
    "report": {"backends", "bench", "cli", "compare", "tune", "workloads", "launch", "native", "netem"},
    "backends": {"bench", "cli", "compare", "tune", "workloads", "explain"},
    "native": {"backends", "bench", "cli", "compare", "launch", "tune", "workloads"},
    "bench": {"cli", "compare", "tune", "workloads"},
    "netem": {"backends", "bench", "cli", "compare", "tune", "workloads", "native"},
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
