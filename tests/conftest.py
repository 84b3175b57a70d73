"""Puts tests/ on sys.path (pytest's prepend mode does that for a conftest's folder), so every test
module can `from wsutil import wirespeed`; `run_cli` is the same helper as a fixture."""
import pytest

from wsutil import wirespeed


@pytest.fixture
def run_cli():
    return wirespeed
