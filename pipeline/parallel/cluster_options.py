"""The cluster kinds and the ``--cluster`` / ``--cluster-config`` options, without Dask.

Kept apart from :mod:`hmdspt.parallel.pools` so that building the command line (``hmdspt
--help``, a usage error) imports neither Dask nor dask-jobqueue.
"""

from __future__ import annotations

import argparse

__all__ = ["BATCH_SYSTEMS", "CLUSTER_KINDS", "JOBQUEUE_KINDS", "add_cluster_arguments"]

#: Batch systems, whose workers run on machines of their own.
BATCH_SYSTEMS = ("slurm", "pbs", "sge", "lsf")
#: What a pools cluster can run on ("local" runs jobs as local processes).
JOBQUEUE_KINDS = (*BATCH_SYSTEMS, "local")
#: Values of ``--cluster``.
CLUSTER_KINDS = ("local", *BATCH_SYSTEMS)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--cluster {local,slurm,pbs,sge,lsf}`` and ``--cluster-config FILE``."""
    parser.add_argument(
        "--cluster",
        choices=CLUSTER_KINDS,
        default=None,
        help="where the workers run: local (default; emulated speeds, or the pools of "
        "--cluster-config as local processes) or a batch system through dask-jobqueue",
    )
    parser.add_argument(
        "--cluster-config",
        metavar="FILE",
        default=None,
        help="YAML pools file (worker pools and common job settings; see "
        "examples/pools.yaml); unset settings come from Dask's jobqueue.<kind> config",
    )
