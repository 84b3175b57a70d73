"""Fixtures for the emulated-cluster tests: skip without root, and leave nothing behind.

Each test gets its own cluster name, so it never touches a cluster a user (or a parallel test run)
has up; teardown removes it and then checks that no namespace, process, hosts file or per-host
/dev/shm directory of it survived.
"""
from __future__ import annotations

import uuid

import pytest
from netem_util import leftovers_of


@pytest.fixture
def cluster_name():
    """A fresh cluster name; whatever the test built under it is removed and checked afterwards."""
    from wirespeed.netem import cluster as C
    name = "t" + uuid.uuid4().hex[:8]
    yield name
    C.down(name)
    assert leftovers_of(name) == [], "cluster teardown left something behind"


