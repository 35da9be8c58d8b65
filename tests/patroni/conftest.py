"""Fixtures of the Patroni suite: one cluster (patronikit.Cluster: etcd, two Patroni nodes,
HAProxy) for the whole module, stopped and removed however the tests end (the folder, with
every log, is kept when QUEEN_PATRONI_KEEP is set); the teardown fails if any process of it
is still alive."""

import os
import tempfile

import pytest

from patronikit import Cluster, remove_dir


@pytest.fixture(scope="module")
def cluster():
    d = tempfile.mkdtemp(prefix="queen-patroni-")
    c = Cluster(d, nodes=2, haproxy=True)
    try:
        c.start()
        yield c
    finally:
        left = c.stop()
        if not left and not os.environ.get("QUEEN_PATRONI_KEEP"):
            remove_dir(d)
        elif os.environ.get("QUEEN_PATRONI_KEEP"):
            print(f"\n[patroni] cluster folder kept: {d}")
    assert not left, f"processes of the Patroni cluster still alive after its teardown: {left} (kept {d})"
