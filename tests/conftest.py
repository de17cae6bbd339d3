"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Worker processes fork from a server that has distributed and numpy imported, instead of
# each spawning a fresh interpreter (distributed's own suite does the same). Set before
# dask is imported so that the subprocesses the tests start (the CLI) inherit it.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "forkserver")

import pytest  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

from tests.clusters import FREE_PORTS  # noqa: E402
from tests.requires import missing  # noqa: E402


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """A real 8 KiB file system (tmpfs) mounted for the test: a disk that fills up."""
    if os.geteuid() != 0:
        missing("mounting a small tmpfs (a real full disk) needs root")
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        # A handle left open makes a plain umount fail (EBUSY); detach it then.
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture(scope="module")
def client():
    """A client of an in-process cluster of two one-thread workers, for a module's tests
    (a module that needs another cluster defines its own ``client``)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as c,
    ):
        yield c
