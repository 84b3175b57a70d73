"""python/wirespeed/_native.pyi says what the built native module exports: every function,
class, exception and Group method, and nothing it does not export."""
import ast
import inspect
from pathlib import Path

import pytest

_native = pytest.importorskip("wirespeed._native")
STUB = Path(__file__).resolve().parents[2] / "python" / "wirespeed" / "_native.pyi"


def stub_names() -> tuple[set[str], set[str]]:
    tree = ast.parse(STUB.read_text())
    top, group = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            top |= {a.asname or a.name for a in node.names if a.asname}
        if isinstance(node, ast.ClassDef) and node.name == "Group":
            group = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} - {"__init__"}
    return top, group


def test_the_stub_names_what_the_native_module_exports():
    top, group = stub_names()
    exported = {n for n in dir(_native) if not n.startswith("_")}
    assert top == exported
    assert group == {n for n in dir(_native.Group) if not n.startswith("_")}


def test_the_stubs_functions_take_the_bindings_arguments():
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            stub = [a.arg for a in node.args.args]
            assert stub == list(inspect.signature(getattr(_native, node.name)).parameters), node.name
