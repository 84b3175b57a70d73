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
    # train --tune reuses tune's knob table, its settings' environments and its interleaving.
    "train": {"cli", "compare"},
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


def rust_paths(code: str, first: bool = False) -> list[list[str]]:
    """Every `crate::`/`super::`/`self::` path in `code`, `use` groups (`a::{b, c::d}`) expanded,
    as lists of segments."""
    out = []

    def tree(i: int, prefix: list[str]) -> int:
        """Read `x::y::{...}` at code[i:] under `prefix`; return where it ends."""
        m = re.match(r"\s*\{", code[i:])
        if m:
            i += m.end()
            while True:
                i = tree(i, prefix)
                sep = re.match(r"\s*(?:as\s+\w+)?\s*([,}]?)", code[i:])
                i += sep.end()
                if sep.group(1) != ",":
                    return i
                if re.match(r"\s*}", code[i:]):     # a trailing comma
                    return i + code[i:].index("}") + 1
        m = re.match(r"\s*(\w+|\*)", code[i:])
        if not m:
            out.append(prefix)
            return i
        prefix, i = prefix + [m.group(1)], i + m.end()
        if code.startswith("::", i):
            return tree(i + 2, prefix)
        out.append(prefix)
        return i

    for m in re.finditer(r"(?<![\w:])(crate|super|self)::", code):
        tree(m.end(), [m.group(1)])
        if first:
            break
    return out


def rust_paths_in_modules(code: str) -> list[tuple[list[str], list[str]]]:
    """rust_paths, each with the inline modules (`mod tests { ... }`) it is written in."""
    spans = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        spans.append((m.start(), i, m.group(1)))
    out = []
    for m in re.finditer(r"(?<![\w:])(crate|super|self)::", code):
        inline = [name for a, b, name in spans if a <= m.start() < b]
        out += [(p, inline) for p in rust_paths(code[m.start():m.start() + 2000], first=True)]
    return out


def rust_code(f: Path) -> str:
    return "\n".join(line.split("//")[0] for line in f.read_text().splitlines())


def folder_graph(folder: Path) -> dict[str, set[str]]:
    """Inside one folder of the core: its files and subfolders (mod.rs is "mod") -> the others
    that each names through `crate::`, `super::` or `self::` paths, or (in mod.rs) through a
    child module's name. mod.rs's `mod x;` and `pub use x::...` (the folder's front) do not count."""
    base = list(folder.relative_to(CORE).parts)
    nodes = {p.stem for p in folder.glob("*.rs")} | {p.name for p in folder.iterdir() if p.is_dir()}
    nodes.discard("mod")
    graph = {n: set() for n in nodes | {"mod"}}
    for f in folder.rglob("*.rs"):
        rel = f.relative_to(folder).parts
        me = "mod" if rel == ("mod.rs",) else (rel[0] if len(rel) > 1 else f.stem)
        inner = list(f.relative_to(CORE).with_suffix("").parts)
        here = inner[:-1] if inner[-1] == "mod" else inner     # the file's own module path
        code = rust_code(f)
        if me == "mod":
            code = re.sub(r"\bpub(\([^)]*\))?\s+use\s[^;]*;", "", code)
            for used in re.findall(r"(?<![\w:])(\w+)::", code):
                if used in nodes:
                    graph[me].add(used)
        for path, inline in rust_paths_in_modules(code):
            head, rest = path[0], path[1:]
            if head == "crate":
                full = rest
            elif head == "self":
                full = here + inline + rest
            else:
                up = (here + inline)[:-1]
                while rest and rest[0] == "super":
                    up, rest = up[:-1], rest[1:]
                full = up + rest
            if full[:len(base)] != base or len(full) == len(base):
                continue
            used = full[len(base)] if full[len(base)] in nodes else "mod"
            if used != me:
                graph[me].add(used)
    return graph


def test_no_circle_between_the_files_of_any_core_folder():
    tcp = folder_graph(CORE / "transport" / "tcp")
    assert {"conn", "reactor", "handshake", "mod"} <= set(tcp) and "mod" in tcp["reactor"], tcp
    found = {str(d.relative_to(CORE)): c for d in sorted(p for p in CORE.rglob("*") if p.is_dir())
             if (c := circles(folder_graph(d)))}
    assert found == {}


def test_the_core_has_a_front_door():
    """lib.rs keeps its modules private and re-exports the API: few public modules (at its top
    level: those nested in `testing` only sort what the tests reach)."""
    public = re.findall(r"^pub\s+mod\s+(\w+)", (CORE / "lib.rs").read_text(), re.M)
    assert "net" in public and len(public) <= 4, public
    # the bindings go through it: neither turns the tests' `testing` door on nor names it
    for binding in ("wirespeed-py", "wirespeed-nccl"):
        crate = CORE.parents[1] / binding
        assert "testing" not in (crate / "Cargo.toml").read_text()
        assert [f for f in crate.rglob("*.rs") if "wirespeed_core::testing" in f.read_text()] == []


def test_the_cores_files_stay_readable_and_one_name_means_one_thing():
    # the cap is 800 lines, and no file is within 10% of it (a split by protocol, not by length)
    long = {str(f.relative_to(CORE)): n for f in CORE.rglob("*.rs")
            if (n := len(f.read_text().splitlines())) > 720}
    assert long == {}
    assert [str(f.relative_to(CORE)) for f in CORE.rglob("tcp.rs")] == []


def test_the_core_reads_the_environment_in_one_module():
    readers = sorted(str(f.relative_to(CORE)) for f in CORE.rglob("*.rs") if "env::var" in f.read_text())
    assert readers == ["config.rs"]


def test_every_unsafe_fn_of_the_core_states_its_contract_once():
    """An `unsafe fn` says its contract in its `# Safety` doc, once: no comment beside it restates
    it. A trait's method implemented has the trait's contract, and a `// SAFETY:` line saying why
    this implementation is sound on that contract alone. (clippy's missing_safety_doc sees only
    what the crate exports; its modules are private.)"""
    bare, unsaid, seen = [], [], 0
    for f in sorted(CORE.rglob("*.rs")):
        lines = f.read_text().splitlines()
        impl = ""
        for i, line in enumerate(lines):
            if re.match(r"(unsafe )?impl\b|(pub(\(\w+\))? )?(unsafe )?trait\b", line):
                impl = line
            elif re.match(r"[^\s/#}]", line):
                impl = ""
            if not re.match(r"\s*(pub(\([\w:]+\))? )?unsafe fn ", line):
                continue
            seen += 1
            doc, j = [], i - 1
            while j >= 0 and re.match(r"\s*(///|#\[|//)", lines[j]):
                doc.append(lines[j])
                j -= 1
            if " for " in impl:
                if not any("SAFETY:" in d for d in doc):
                    unsaid.append(f"{f.relative_to(CORE)}:{i + 1}")
                continue
            assert not any("SAFETY:" in d for d in doc), f"{f.relative_to(CORE)}:{i + 1} restates its contract"
            if not any("# Safety" in d for d in doc):
                bare.append(f"{f.relative_to(CORE)}:{i + 1}")
    assert seen > 40 and bare == [] and unsaid == []
