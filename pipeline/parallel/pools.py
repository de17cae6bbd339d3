"""Heterogeneous worker pools on a shared cluster (SLURM, PBS, SGE, LSF), one scheduler.

A *pool* is a group of identical batch jobs: so many cores, so much memory, so many worker
processes, a queue (partition), a walltime and any extra directives. A shared cluster is
rarely homogeneous, and HMDSPT is made for exactly that, so a run usually wants several
pools (a few big nodes and many small ones, a GPU partition and a CPU one, ...) whose
workers all talk to ONE scheduler, so that one ``Client`` sees every worker.

dask-jobqueue has one job template per cluster object (its issues 378, 381 and 419 discuss
mixed pools). Its clusters are ``distributed.SpecCluster`` objects, though: a dict
``worker_spec`` maps each job's name to ``{"cls": JobClass, "options": kwargs}`` and the
cluster submits whatever that dict holds. :class:`PooledJobCluster` keeps the scheduler
and the common template of a dask-jobqueue cluster and adds, per pool, entries whose
options are the common job keywords overridden by the pool's. Those SpecCluster
internals (``worker_spec``, ``_correct_state``) are used here and nowhere else; the
public surface is :class:`PoolSpec`, :func:`start_pools`, :meth:`PooledJobCluster.scale_pool`,
:func:`pool_job_scripts` and the configuration loaders.

Each job of pool ``p`` is named ``p-<i>`` (``i`` counts up and is never reused); with
``processes > 1`` its workers are ``p-<i>-<j>``. Each worker also carries the resource
``pool-p=1``, so tasks can be pinned to a pool (``client.submit(..., resources={"pool-big":
1})``) and the run log and the monitor, which show worker names, show the pool.

Configuration comes from Python (``PoolSpec`` objects and keyword arguments), from a YAML
pools file (:func:`load_cluster_config`; see ``examples/pools.yaml``) and, for everything
neither sets, from Dask's own ``jobqueue.<kind>`` configuration (``~/.config/dask/
jobqueue.yaml``), which dask-jobqueue reads as usual.

``kind="local"`` runs the same machinery with dask-jobqueue's ``LocalCluster``: each job is
a local process started from the job script's command line (no header, no prologue). It is
meant for trying a pools file on a laptop and for tests, not for performance.
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import dask
from dask.utils import format_bytes, parse_bytes
from distributed.core import Status
from distributed.deploy.adaptive import Adaptive

from hmdspt.parallel.cluster_options import (
    BATCH_SYSTEMS,
    CLUSTER_KINDS,
    JOBQUEUE_KINDS,
    add_cluster_arguments,
)

__all__ = [
    "BATCH_SYSTEMS",
    "CLUSTER_KINDS",
    "JOBQUEUE_KINDS",
    "ClusterConfig",
    "ClusterConfigError",
    "JobSubmissionError",
    "PoolAdaptive",
    "PoolSpec",
    "PooledJobCluster",
    "PoolsTimeoutError",
    "add_cluster_arguments",
    "client_from_args",
    "cluster_config_from_dict",
    "cmd_cluster_dry_run",
    "load_cluster_config",
    "pool_job_scripts",
    "pool_of",
    "start_pools",
]


_POOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_PLACEHOLDER_SCHEDULER = "tcp://<scheduler-address>:8786"
# Keywords of JobQueueCluster.__init__ that configure the cluster/scheduler, not a job.
_CLUSTER_ONLY = frozenset(
    {
        "loop",
        "security",
        "shared_temp_directory",
        "silence_logs",
        "name",
        "asynchronous",
        "scheduler_options",
        "scheduler_cls",
        "dashboard_address",
        "host",
    }
)
# Job keywords holding lists: a pool's entries are added to the common ones.
_LIST_KEYS = ("job_extra_directives", "worker_extra_args", "job_script_prologue")
# Old spellings dask-jobqueue still accepts (with a warning) and a section may hold.
_DEPRECATED_JOB_KEYS = frozenset({"env_extra", "extra", "header_skip", "job_extra", "project"})
# Keywords the pools layer sets itself, per job.
_RESERVED = frozenset({"scheduler", "n_workers", "job_cls", "config_name"})


class ClusterConfigError(ValueError):
    """A pools configuration (Python, YAML or command line) that cannot be used."""


class PoolsTimeoutError(TimeoutError):
    """Not every job of every pool connected in time (queued, failed or too slow)."""


class JobSubmissionError(RuntimeError):
    """The batch system's submission command (``sbatch``, ``qsub``, ``bsub``) failed."""

    @classmethod
    def from_jobqueue(cls, exc: RuntimeError) -> JobSubmissionError | None:
        """The error dask-jobqueue's failed command raised, in one line; None for another
        RuntimeError. Its message is a paragraph whose first line names no cause."""
        found = re.match(
            r"Command exited with non-zero exit code.\nExit code: (\S+)\nCommand:\n(.*?)\n"
            r"stdout:\n.*?\nstderr:\n(.*)",
            str(exc),
            flags=re.S,
        )
        if found is None:
            return None
        code, command, stderr = found.groups()
        program = command.split()[0] if command.split() else command
        said = next((line.strip() for line in stderr.splitlines() if line.strip()), "")
        return cls(
            f"{program} failed (exit code {code}): {said or 'it printed nothing on stderr'}; "
            "`hmdspt cluster --dry-run` prints the job scripts"
        )


# ----------------------------------------------------------------------------- PoolSpec
@dataclass(frozen=True)
class PoolSpec:
    """One pool of identical batch jobs.

    Every field left at None comes from the common keywords of :func:`start_pools` and,
    failing those, from Dask's ``jobqueue.<kind>`` configuration.

    Parameters
    ----------
    name : str
        Pool name: a letter, then letters, digits or ``_``. Jobs are named ``<name>-<i>``
        and workers carry the resource ``pool-<name>=1``.
    count : int, default=1
        Number of jobs (0 declares the pool without starting any).
    cores : int, optional
        Cores per job (``--cpus-per-task``, ``ncpus``, ...).
    memory : str, optional
        Memory per job, e.g. ``"4GiB"``.
    processes : int, optional
        Worker processes per job; each gets ``cores / processes`` threads and
        ``memory / processes``. HMDSPT trains one model replica per worker process.
    queue : str, optional
        Queue or partition.
    walltime : str, optional
        In the batch system's format (``"01:00:00"``; LSF: ``"01:00"``).
    job_extra_directives : sequence of str, default=()
        Directives added after the common ones (``"--constraint=skylake"``, ``"-pe smp 4"``).
    resources : mapping of str to float, default={}
        Extra worker resources, besides ``pool-<name>=1``.
    blas_threads : int, "auto" or None, default=1
        Exported as ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS`` in the
        job script. 1 (one BLAS thread per worker thread: docs/design.md, "Heterogeneity
        on one machine") because
        a round trains one model replica per worker process on one thread: on this 2-core
        machine a 1-core and a 2-core job side by side probed 0.71M and 0.86M rows/s with 1
        BLAS thread each, but 1.16M and 0.07M with ``"auto"`` (the 2-core worker's two
        OpenBLAS threads fight the third busy thread). ``"auto"`` is the threads per
        worker process (for big layers on a node the job has to itself); None leaves the
        environment alone.
    config_name : str, optional
        A section of Dask's ``jobqueue`` configuration (``jobqueue.yaml``) that this pool
        takes its settings from, as dask-jobqueue's ``config_name=`` does for a cluster:
        what the pool leaves at None comes from ``jobqueue.<config_name>`` before the
        common keywords, and what that section does not set from them (the section must
        exist; it may hold only the settings that differ).
    options : mapping, default={}
        Any other keyword of the kind's job class (``account``, ``resource_spec``,
        ``job_name``, ``job_script_prologue``, ``worker_extra_args``, ...); checked
        against the job class when the pool is used. ``job_script_prologue`` and
        ``worker_extra_args`` are added to the common ones, not put in their place.
    """

    name: str
    count: int = 1
    cores: int | None = None
    memory: str | None = None
    processes: int | None = None
    queue: str | None = None
    walltime: str | None = None
    job_extra_directives: tuple[str, ...] = ()
    resources: Mapping[str, float] = field(default_factory=dict)
    blas_threads: int | str | None = 1
    config_name: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _POOL_NAME.match(self.name):
            raise ClusterConfigError(
                f"pool name must be a letter followed by letters, digits or '_' "
                f"(it becomes part of job and worker names), got {self.name!r}"
            )
        where = f"pool {self.name!r}"
        _check_int(self.count, f"{where}: count", minimum=0)
        if self.cores is not None:
            _check_int(self.cores, f"{where}: cores", minimum=1)
        if self.processes is not None:
            _check_int(self.processes, f"{where}: processes", minimum=1)
            if self.cores is not None and self.processes > self.cores:
                raise ClusterConfigError(
                    f"{where}: processes ({self.processes}) > cores ({self.cores}) would "
                    "leave workers with no thread"
                )
        if self.memory is not None:
            try:
                parse_bytes(self.memory)
            except (ValueError, TypeError):
                raise ClusterConfigError(
                    f"{where}: memory must be like '4GiB', got {self.memory!r}"
                ) from None
        directives = self.job_extra_directives
        if isinstance(directives, str):
            directives = (directives,)
        object.__setattr__(self, "job_extra_directives", tuple(str(d) for d in directives))
        resources = dict(self.resources or {})
        for key, value in resources.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ClusterConfigError(f"{where}: resource {key!r} must be a non-negative number")
            if re.search(r"[\s=,]", str(key)):
                raise ClusterConfigError(f"{where}: resource name {key!r} has '=', ',' or a space")
        object.__setattr__(self, "resources", resources)
        if self.blas_threads not in ("auto", None):
            _check_int(self.blas_threads, f"{where}: blas_threads", minimum=1)
        if self.config_name is not None:
            if not isinstance(self.config_name, str):
                raise ClusterConfigError(f"{where}: config_name must be a string")
            if dask.config.get(f"jobqueue.{self.config_name}", None) is None:
                raise ClusterConfigError(
                    f"{where}: no section jobqueue.{self.config_name} in the Dask "
                    "configuration (jobqueue.yaml)"
                )
        options = dict(self.options or {})
        clash = sorted((set(options) & {f.name for f in fields(self)}) | (set(options) & _RESERVED))
        if clash:
            raise ClusterConfigError(f"{where}: {', '.join(clash)} cannot be set in options")
        object.__setattr__(self, "options", options)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], name: str | None = None) -> PoolSpec:
        """A pool from a mapping (a YAML entry); keys may be ``kebab-case`` as in Dask files.

        Keys that are not fields of :class:`PoolSpec` go to ``options``.
        """
        if not isinstance(data, Mapping):
            raise ClusterConfigError(f"a pool must be a mapping, got {data!r}")
        data = _snake_keys(data)
        if name is not None:
            if "name" in data and data["name"] != name:
                raise ClusterConfigError(f"pool {name!r} has a different name {data['name']!r}")
            data["name"] = name
        if "name" not in data:
            raise ClusterConfigError(f"a pool needs a name: {dict(data)!r}")
        known = {f.name for f in fields(cls)}
        options = dict(data.pop("options", None) or {})
        options.update({k: data.pop(k) for k in list(data) if k not in known})
        return cls(**data, options=_snake_keys(options))

    def describe(self) -> str:
        """``name: 2 jobs x 4 cores, 8 GiB, 1 process, queue q, walltime w``."""
        parts = [f"{self.count} job{'s' if self.count != 1 else ''}"]
        if self.cores is not None:
            parts[0] += f" x {self.cores} core{'s' if self.cores != 1 else ''}"
        if self.memory is not None:
            parts.append(format_bytes(parse_bytes(self.memory)))
        if self.processes is not None:
            parts.append(f"{self.processes} process{'es' if self.processes > 1 else ''}")
        if self.queue:
            parts.append(f"queue {self.queue}")
        if self.walltime:
            parts.append(f"walltime {self.walltime}")
        if self.config_name:
            parts.append(f"config jobqueue.{self.config_name}")
        return f"{self.name}: {', '.join(parts)}"


def _check_int(value: Any, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ClusterConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")


def _snake_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    # Dask's YAML files spell keys in kebab-case (job-extra-directives); Python uses snake.
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _is_worker_of(worker: Any, job: str) -> bool:
    worker = str(worker)
    return worker == job or worker.startswith(job + "-")


def pool_of(worker_name: str) -> str:
    """The pool of a worker or job named ``<pool>-<i>[-<j>]`` (pool names have no ``-``)."""
    return str(worker_name).split("-", 1)[0]


def _put_back_sigint(handler) -> None:
    """Undo what importing dask-jobqueue does to the process: ``dask_jobqueue.runner`` sets
    SIGINT to ``sys.exit()``, so Ctrl-C would end a fit, or the command, as a clean exit
    (status 0) instead of stopping the fit at its round's end."""
    if (
        handler is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not handler
    ):
        signal.signal(signal.SIGINT, handler)


# ------------------------------------------------------------------ job keywords per pool
def _job_class(kind: str):
    kind = _check_kind(kind, JOBQUEUE_KINDS)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError as exc:  # an optional dependency
        raise ImportError(
            "worker pools need dask-jobqueue: pip install 'hmdspt[jobqueue]'"
        ) from exc
    finally:
        _put_back_sigint(sigint)
    from dask_jobqueue.local import LocalJob
    from dask_jobqueue.lsf import LSFJob
    from dask_jobqueue.pbs import PBSJob
    from dask_jobqueue.sge import SGEJob
    from dask_jobqueue.slurm import SLURMJob

    return {"slurm": SLURMJob, "pbs": PBSJob, "sge": SGEJob, "lsf": LSFJob, "local": LocalJob}[kind]


def _check_kind(kind: str, allowed: Sequence[str]) -> str:
    if kind not in allowed:
        raise ClusterConfigError(f"cluster kind must be one of {', '.join(allowed)}, got {kind!r}")
    return kind


def _job_keywords(job_cls) -> set[str]:
    names: set[str] = set()
    for klass in job_cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self":
                names.add(p.name)
    return names


def _merge_resources(args: list[str], resources: Mapping[str, float]) -> list[str]:
    """``worker_extra_args`` with ``resources`` added to (one) ``--resources`` argument."""
    out, merged = [], {}
    i = 0
    while i < len(args):
        arg = str(args[i])
        if arg == "--resources" and i + 1 < len(args):
            text, i = str(args[i + 1]), i + 2
        elif arg.startswith("--resources="):
            text, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        for pair in text.replace(",", " ").split():
            key, _, value = pair.partition("=")
            merged[key] = float(value)
    merged.update(resources)
    # Commas, not spaces: dask-jobqueue joins the command line without quoting, and
    # ``dask worker`` accepts comma-separated resources.
    return [*out, "--resources", ",".join(f"{k}={v:g}" for k, v in merged.items())]


def _pool_job_kwargs(kind: str, base: Mapping[str, Any], pool: PoolSpec) -> dict[str, Any]:
    """The job class keywords of one pool: common ``base`` overridden by the pool's.

    ``base`` holds the job keywords of the cluster (``JobQueueCluster._job_kwargs``, or the
    same built without a cluster for a dry run), including ``config_name``.
    """
    job_cls = _job_class(kind)
    kw = dict(base)
    config_name = kw.get("config_name") or job_cls.config_name
    if pool.config_name is not None:
        # The pool's section over the common keywords; what it does not set comes from
        # them, then from the cluster's section (a pool's section may be partial).
        section = _snake_keys(dask.config.get(f"jobqueue.{pool.config_name}") or {})
        if "name" in section:
            section["job_name"] = section.pop("name")  # the config's key for job_name
        accepted = _job_keywords(job_cls) - _DEPRECATED_JOB_KEYS - {"name", "config_name"}
        kw.update({k: v for k, v in section.items() if k in accepted and v is not None})

    def config(key: str, default: Any = None) -> Any:
        return dask.config.get(f"jobqueue.{config_name}.{key}", default)

    unknown = sorted(set(pool.options) - _job_keywords(job_cls))
    if unknown:
        raise ClusterConfigError(
            f"pool {pool.name!r}: unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} for {kind} jobs"
        )
    # List settings add up, common first: a pool adds a directive or a worker argument
    # without having to repeat (or being able to lose) the common ones.
    lists = {}
    for key in _LIST_KEYS:
        common_list = kw.get(key)
        if common_list is None:
            common_list = config(key.replace("_", "-"), []) or []
        lists[key] = [*common_list, *pool.options.get(key, ())]
    lists["job_extra_directives"] += pool.job_extra_directives
    kw.update(pool.options)
    kw.update(lists)
    for key in ("cores", "memory", "processes", "queue", "walltime"):
        value = getattr(pool, key)
        if value is not None:
            kw[key] = value
    kw["worker_extra_args"] = _merge_resources(
        kw["worker_extra_args"], {f"pool-{pool.name}": 1, **pool.resources}
    )
    # A job name per pool, so that squeue/qstat/bjobs show which pool a job belongs to.
    if "job_name" not in pool.options:
        kw["job_name"] = f"{kw.get('job_name') or config('name') or 'dask-worker'}-{pool.name}"

    cores = kw.get("cores", None)
    if cores is None:
        cores = config("cores")
    memory = kw.get("memory", None)
    if memory is None:
        memory = config("memory")
    if cores is None or memory is None:
        raise ClusterConfigError(
            f"pool {pool.name!r}: cores and memory must be set (in the pool, the common "
            f"settings or jobqueue.{config_name} of the Dask configuration)"
        )
    processes = kw.get("processes", None)
    if processes is None:
        processes = config("processes")
    if processes is None:
        from distributed.deploy.local import nprocesses_nthreads

        processes, _ = nprocesses_nthreads(cores)
    kw["processes"] = processes
    if processes > cores:
        raise ClusterConfigError(f"pool {pool.name!r}: processes ({processes}) > cores ({cores})")
    if pool.blas_threads is not None and kind != "local":
        # dask-jobqueue's LocalJob runs only the command line of the script, no prologue.
        n = cores // processes if pool.blas_threads == "auto" else pool.blas_threads
        kw["job_script_prologue"] = [
            *kw["job_script_prologue"],
            f"export OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} MKL_NUM_THREADS={n}",
        ]
    return kw


def _split_common(kind: str, common: Mapping[str, Any]) -> tuple[dict, dict]:
    """Split common keywords into (cluster keywords, job keywords)."""
    common = _snake_keys(common)
    reserved = sorted(set(common) & _RESERVED - {"config_name"})
    if reserved:
        raise ClusterConfigError(f"{', '.join(reserved)} cannot be set for a pools cluster")
    cluster_kw = {k: v for k, v in common.items() if k in _CLUSTER_ONLY}
    job_kw = {k: v for k, v in common.items() if k not in _CLUSTER_ONLY}
    if "config_name" in common:
        cluster_kw["config_name"] = common["config_name"]
    unknown = sorted(set(job_kw) - _job_keywords(_job_class(kind)) - {"protocol", "interface"})
    if unknown:
        raise ClusterConfigError(f"unknown setting(s) for {kind} jobs: {', '.join(unknown)}")
    return cluster_kw, job_kw


def pool_job_scripts(kind: str, pools: Iterable[PoolSpec], **common: Any) -> dict[str, str]:
    """The job script of each pool, built without a scheduler and without submitting.

    Parameters
    ----------
    kind : {"slurm", "pbs", "sge", "lsf", "local"}
        Batch system.
    pools : iterable of PoolSpec
        The pools.
    **common
        Common keywords, as for :func:`start_pools`.

    Returns
    -------
    scripts : dict of str to str
        By pool name: the script of the pool's first job (``<pool>-0``); the scheduler
        address is a placeholder (``tcp://<scheduler-address>:8786``) that the real run
        replaces with the scheduler's. Other jobs of the pool differ only in ``--name``.

    Notes
    -----
    dask-jobqueue creates ``log_directory`` when it builds a job, so a dry run does too.
    """
    pools = _check_pools(pools)
    cluster_kw, job_kw = _split_common(kind, common)
    job_cls = _job_class(kind)
    config_name = cluster_kw.get("config_name") or job_cls.config_name
    # What JobQueueCluster.__init__ adds to the job keywords (security needs a cluster).
    job_kw["config_name"] = config_name
    if job_kw.get("interface") is None:
        job_kw["interface"] = dask.config.get(f"jobqueue.{config_name}.interface", None)
    scripts = {}
    for pool in pools:
        kw = _pool_job_kwargs(kind, job_kw, pool)
        try:
            job = job_cls(_PLACEHOLDER_SCHEDULER, name=f"{pool.name}-0", **kw)
        except TypeError as exc:
            raise ClusterConfigError(f"pool {pool.name!r}: {exc}") from None
        scripts[pool.name] = job.job_script()
    return scripts


def _check_pools(pools: Iterable[PoolSpec]) -> list[PoolSpec]:
    if isinstance(pools, PoolSpec):
        pools = [pools]
    pools = list(pools)
    for pool in pools:
        if not isinstance(pool, PoolSpec):
            raise ClusterConfigError(f"pools must be PoolSpec objects, got {pool!r}")
    names = [p.name for p in pools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ClusterConfigError(f"pool names must be unique: {', '.join(dup)} repeated")
    return pools


# ------------------------------------------------------------------------- the cluster
class PoolAdaptive(Adaptive):
    """dask's ``Adaptive`` for one pool of a :class:`PooledJobCluster`.

    It sees the pool's workers only (``plan``, ``requested``, ``observed``), aims at the
    scheduler's target less the other pools' workers, scales up by the pool's jobs and
    retires the pool's newest jobs whole.
    """

    def __init__(self, cluster: PooledJobCluster, pool: str, **kwargs: Any) -> None:
        self.pool = pool
        super().__init__(cluster, **kwargs)

    def _mine(self, names: Iterable[Any]) -> set:
        return {n for n in names if pool_of(str(n)) == self.pool}

    @property
    def plan(self) -> set:
        return self._mine(self.cluster.plan)

    @property
    def requested(self) -> set:
        return self._mine(self.cluster.requested)

    @property
    def observed(self) -> set:
        return self._mine(self.cluster.observed)

    async def target(self) -> int:
        total = await self.scheduler.adaptive_target(target_duration=self.target_duration)
        others = len(self.cluster.observed) - len(self.observed)
        return max(0, total - others)

    async def workers_to_close(self, target: int) -> list[str]:
        """The pool's newest jobs, whole, while the rest still holds ``target`` workers."""
        jobs = list(self.cluster._jobs[self.pool])
        observed = {str(n) for n in self.observed}
        close: list[str] = []
        while jobs:
            job = jobs[-1]
            workers = sorted(w for w in observed if _is_worker_of(w, job))
            if len(observed) - len(workers) < target:
                break
            close += workers
            observed -= set(workers)
            jobs.pop()
        return close

    async def scale_up(self, n: int) -> None:
        processes = self.cluster._pool_kwargs[self.pool]["processes"]
        f = self.cluster.scale_pool(self.pool, math.ceil(n / processes))
        if inspect.isawaitable(f):
            await f

    async def scale_down(self, workers: Iterable[str]) -> None:
        workers = list(workers)
        if not workers:
            return
        await self.scheduler.retire_workers(names=workers, remove=True, close_workers=True)
        jobs = {j for j in self.cluster._jobs[self.pool] for w in workers if _is_worker_of(w, j)}
        f = self.cluster._drop_jobs(self.pool, jobs)
        if inspect.isawaitable(f):
            await f


class PooledJobCluster:
    """Mixin over a dask-jobqueue cluster class: several pools under its one scheduler.

    Do not instantiate it directly: :func:`start_pools` (or :func:`pooled_cluster_class`)
    gives the class for a batch system, e.g. ``PooledSLURMCluster(pools, **common)``.
    It is a real ``SLURMCluster`` (``PBSCluster``, ...): ``Client(cluster)``,
    ``cluster.close()``, ``cluster.dashboard_link`` and ``cluster.job_script()`` (the
    common template) work as usual.

    Each pool has its own job template, so :meth:`scale` takes the pool to scale
    (``scale(jobs=2, pool="big")``, or ``n`` workers, ``memory`` or ``cores`` as
    dask-jobqueue's ``scale`` does; ``scale(0)`` stops every job, as ``close`` does), as
    does :meth:`scale_pool`; :meth:`adapt` likewise adapts one pool between its own
    bounds (``adapt(pool="big", minimum_jobs=0, maximum_jobs=4)``).

    Attributes
    ----------
    pools : dict of str to PoolSpec
        The pools, with ``count`` the number of jobs currently asked for.
    last_scale_s : float or None
        Seconds from the last :meth:`scale_pool` (or start) to every requested worker
        connected, as measured by :meth:`wait_for_pools`.
    """

    kind: str = ""

    def __init__(self, pools: Iterable[PoolSpec] = (), **common: Any) -> None:
        pools = _check_pools(pools)
        cluster_kw, job_kw = _split_common(self.kind, common)
        config_name = cluster_kw.get("config_name") or self.job_cls.config_name
        # A shared machine: never take the default dashboard port 8787 from a neighbour.
        scheduler_options = dict(
            cluster_kw.get("scheduler_options")
            or dask.config.get(f"jobqueue.{config_name}.scheduler-options", {})
            or {}
        )
        scheduler_options.setdefault("dashboard_address", ":0")
        cluster_kw["scheduler_options"] = scheduler_options
        # dask-jobqueue builds its common job template at construction and refuses one
        # without cores and memory. Pools may set them alone: then the template borrows
        # the first pool's, and the pools never inherit these borrowed values.
        self._borrowed: set[str] = set()
        for key in ("cores", "memory"):
            if job_kw.get(key) is None and dask.config.get(f"jobqueue.{config_name}.{key}") is None:
                value = next((getattr(p, key) for p in pools if getattr(p, key) is not None), None)
                job_kw[key] = value if value is not None else {"cores": 1, "memory": "1GiB"}[key]
                self._borrowed.add(key)
        self.pools: dict[str, PoolSpec] = {}
        self._pool_kwargs: dict[str, dict[str, Any]] = {}
        self._jobs: dict[str, list[str]] = {}  # pool -> job names, oldest first
        self._next_job: dict[str, int] = {}
        self.last_scale_s: float | None = None
        self._scale_started: float | None = None
        self._adaptives: dict[str, PoolAdaptive] = {}
        super().__init__(n_workers=0, **cluster_kw, **job_kw)
        try:
            for pool in pools:
                self._register(pool)
            self._scale_started = time.perf_counter()
            self._sync_jobs()
        except BaseException:
            self.close()
            raise

    # -- pools
    def _register(self, pool: PoolSpec) -> None:
        if pool.name in self.pools:
            raise ClusterConfigError(f"pool {pool.name!r} already exists")
        # Build one job now: a bad keyword fails here, before anything is submitted.
        base = {k: v for k, v in self._job_kwargs.items() if k not in self._borrowed}
        kwargs = _pool_job_kwargs(self.kind, base, pool)
        try:
            self.job_cls(_PLACEHOLDER_SCHEDULER, name=f"{pool.name}-0", **kwargs)
        except TypeError as exc:
            raise ClusterConfigError(f"pool {pool.name!r}: {exc}") from None
        self.pools[pool.name] = pool
        self._jobs[pool.name] = []
        self._next_job[pool.name] = 0
        self._pool_kwargs[pool.name] = kwargs
        self._set_count(pool.name, pool.count)

    def _set_count(self, name: str, count: int) -> None:
        """Change ``worker_spec`` so that pool ``name`` has ``count`` jobs (no submission)."""
        jobs = self._jobs[name]
        kwargs = self._pool_kwargs[name]
        while len(jobs) < count:
            job = f"{name}-{self._next_job[name]}"
            self._next_job[name] += 1  # never reuse a name: old logs stay unambiguous
            spec: dict[str, Any] = {"cls": self.job_cls, "options": dict(kwargs)}
            if kwargs["processes"] > 1:
                # The job starts ``dask worker --nworkers P``, whose workers are <job>-<j>.
                spec["group"] = [f"-{j}" for j in range(kwargs["processes"])]
            self.worker_spec[job] = spec
            jobs.append(job)
        if len(jobs) > count:
            connected = {w["name"] for w in self.scheduler_info.get("workers", {}).values()}
            # Drop jobs that have not connected yet first (queued ones), then the newest.
            order = sorted(
                jobs,
                key=lambda j: (any(_is_worker_of(c, j) for c in connected), -jobs.index(j)),
            )
            for job in order[: len(jobs) - count]:
                self.worker_spec.pop(job, None)
                jobs.remove(job)
        self.pools[name] = replace(self.pools[name], count=count)

    def _sync_jobs(self):
        # Submits new jobs and cancels dropped ones (SpecCluster's reconciliation). In a
        # synchronous cluster this blocks until every submission returned, so an sbatch
        # error is raised here rather than showing up later as a timeout.
        try:
            return self.sync(self._correct_state)
        except RuntimeError as exc:
            failed = JobSubmissionError.from_jobqueue(exc)
            if failed is None:
                raise
            raise failed from exc

    def add_pool(self, pool: PoolSpec):
        """Add a pool and submit its ``pool.count`` jobs.

        Returns
        -------
        None, or an awaitable in an asynchronous cluster.
        """
        self._register(pool)
        self._scale_started = time.perf_counter()
        return self._sync_jobs()

    def scale_pool(self, name: str, count: int):
        """Ask for ``count`` jobs in pool ``name`` (submitting or cancelling jobs).

        Jobs that have not connected yet are cancelled first, then the newest. New jobs get
        new numbers; a job whose workers left (walltime, ``scancel``) stays planned, and
        SpecCluster resubmits it under its old name at the next reconciliation (this call
        or :meth:`add_pool`), as dask-jobqueue does.

        Returns
        -------
        None, or an awaitable in an asynchronous cluster.
        """
        if name not in self.pools:
            raise ClusterConfigError(f"no pool {name!r}; pools: {', '.join(self.pools)}")
        _check_int(count, f"pool {name!r}: count", minimum=0)
        self._set_count(name, count)
        self._scale_started = time.perf_counter()
        return self._sync_jobs()

    def scale(self, n=None, jobs=0, memory=None, cores=None, *, pool: str | None = None):
        """Scale one pool as dask-jobqueue scales a cluster, or stop every job.

        Parameters
        ----------
        n : int, optional
            Workers wanted in ``pool`` (rounded up to whole jobs of its ``processes``).
        jobs : int, default=0
            Jobs wanted in ``pool``.
        memory, cores : str or int, optional
            Total memory or cores wanted in ``pool``, in whole jobs of its size.
        pool : str, optional
            The pool to scale; required unless every job is to stop (``scale(0)``).

        Returns
        -------
        None, or an awaitable in an asynchronous cluster.
        """
        if pool is not None:
            return self.scale_pool(pool, self._jobs_for(pool, n, jobs, memory, cores))
        if n not in (None, 0) or jobs or memory is not None or cores is not None:
            raise ClusterConfigError(
                "a pools cluster has one job template per pool: name it, "
                f"scale(jobs=N, pool=NAME) with NAME one of {', '.join(self.pools)}"
            )
        # scale(0) is how SpecCluster.close stops every job.
        for name in self.pools:
            self._set_count(name, 0)
        return super().scale(0)

    def _jobs_for(self, pool: str, n, jobs, memory, cores) -> int:
        """Jobs of ``pool`` for dask-jobqueue's ``scale`` arguments."""
        if pool not in self.pools:
            raise ClusterConfigError(f"no pool {pool!r}; pools: {', '.join(self.pools)}")
        kwargs = self._pool_kwargs[pool]
        if n is not None:
            return math.ceil(n / kwargs["processes"])
        if memory is not None:
            return math.ceil(parse_bytes(memory) / parse_bytes(kwargs["memory"]))
        if cores is not None:
            return math.ceil(cores / kwargs["cores"])
        return int(jobs)

    def adapt(
        self,
        *,
        pool: str | None = None,
        minimum_jobs: int | None = None,
        maximum_jobs: int | None = None,
        minimum: int = 0,
        maximum: float = math.inf,
        **kwargs: Any,
    ):
        """Scale one pool with the scheduler's load, as dask-jobqueue's ``adapt`` does.

        Parameters
        ----------
        pool : str
            The pool that adapts; each pool adapts on its own, between its own bounds.
        minimum_jobs, maximum_jobs : int, optional
            Bounds in jobs (they win over ``minimum``/``maximum``, in workers).
        minimum, maximum : int, default=0 and inf
            Bounds in workers of the pool.
        **kwargs
            For :class:`distributed.deploy.Adaptive` (``interval``, ``wait_count``,
            ``target_duration``).

        Returns
        -------
        adaptive : PoolAdaptive
            Stopped by ``adaptive.stop()``, by ``adapt`` again on the same pool, or when the
            cluster closes.

        Notes
        -----
        The scheduler asks for a number of workers for the whole cluster; a pool adds
        what the other pools' workers leave missing (so two adaptive pools share the
        load, not double it) and gives back its own workers, whole jobs at a time.
        """
        if pool is None:
            raise ClusterConfigError(
                "a pools cluster adapts per pool: adapt(pool=NAME, minimum_jobs=, "
                f"maximum_jobs=) with NAME one of {', '.join(self.pools)}"
            )
        if pool not in self.pools:
            raise ClusterConfigError(f"no pool {pool!r}; pools: {', '.join(self.pools)}")
        processes = self._pool_kwargs[pool]["processes"]
        if minimum_jobs is not None:
            minimum = minimum_jobs * processes
        if maximum_jobs is not None:
            maximum = maximum_jobs * processes
        if minimum > maximum:
            raise ClusterConfigError(f"pool {pool!r}: minimum ({minimum}) > maximum ({maximum})")
        previous = self._adaptives.pop(pool, None)
        if previous is not None:
            previous.stop()
        adaptive = PoolAdaptive(self, pool, minimum=minimum, maximum=maximum, **kwargs)
        self._adaptives[pool] = adaptive
        return adaptive

    def _drop_jobs(self, pool: str, jobs: Iterable[str]):
        """Take ``jobs`` of ``pool`` out of the plan and cancel them (adaptive scale-down)."""
        for job in jobs:
            if job in self._jobs[pool]:
                self._jobs[pool].remove(job)
                self.worker_spec.pop(job, None)
        self.pools[pool] = replace(self.pools[pool], count=len(self._jobs[pool]))
        return self._sync_jobs()

    def _stop_adapting(self) -> None:
        for adaptive in self._adaptives.values():
            adaptive.stop()
        self._adaptives.clear()

    async def _close(self) -> None:
        self._stop_adapting()
        self._mark_jobs_closing()
        await super()._close()

    def _mark_jobs_closing(self) -> None:
        """Every job this cluster made is closing from here on. dask-jobqueue's jobs never
        say so themselves (their close only cancels the job), and SpecCluster's close ends
        by asserting that each job it made and still in memory does: a job a traceback kept
        in memory (a failed submission's) failed that check, and its AssertionError
        replaced the submission's error."""
        # A function of its own: no reference to a job outlives it.
        for job in list(self._created):
            if job.status not in (Status.closing, Status.closed, Status.failed):
                job.status = Status.closing

    # -- inspection
    def job_script(self, pool: str | None = None) -> str:
        """The job script of ``pool`` (its first job), or the common template if None."""
        if pool is None:
            return super().job_script()
        if pool not in self.pools:
            raise ClusterConfigError(f"no pool {pool!r}; pools: {', '.join(self.pools)}")
        address = getattr(self.scheduler, "address", None) or _PLACEHOLDER_SCHEDULER
        job = self.job_cls(address, name=f"{pool}-0", **self._pool_kwargs[pool])
        return job.job_script()

    def job_scripts(self) -> dict[str, str]:
        """:meth:`job_script` of every pool, by pool name."""
        return {name: self.job_script(name) for name in self.pools}

    def planned_workers(self) -> dict[str, list[str]]:
        """Worker names every pool should have once all its jobs run, by pool."""
        out: dict[str, list[str]] = {}
        for name, jobs in self._jobs.items():
            suffixes = self.worker_spec[jobs[0]].get("group", [""]) if jobs else [""]
            out[name] = [f"{job}{s}" for job in jobs for s in suffixes]
        return out

    def workers_by_pool(self) -> dict[str, list[str]]:
        """Names of the connected workers, by pool."""
        out: dict[str, list[str]] = {name: [] for name in self.pools}
        for info in self.scheduler_info.get("workers", {}).values():
            name = str(info.get("name"))
            out.setdefault(pool_of(name), []).append(name)
        return {k: sorted(v) for k, v in out.items()}

    def job_ids(self) -> dict[str, str | None]:
        """Batch system job id of every submitted job, by job name."""
        return {name: getattr(job, "job_id", None) for name, job in self.workers.items()}

    def wait_for_pools(self, timeout: float | None = 600.0, poll: float = 0.2) -> float:
        """Block until every planned worker of every pool is connected.

        Parameters
        ----------
        timeout : float or None, default=600
            Seconds; None waits for ever.
        poll : float, default=0.2
            Seconds between looks at the scheduler.

        Returns
        -------
        seconds : float
            From the last start/:meth:`scale_pool` to all connected (also stored in
            ``last_scale_s``).

        Raises
        ------
        PoolsTimeoutError
            Naming the missing workers and their jobs' ids (look them up in the queue).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = {w for names in self.planned_workers().values() for w in names}
        while True:
            connected = {
                str(w.get("name")) for w in self.scheduler_info.get("workers", {}).values()
            }
            missing = sorted(wanted - connected)
            if not missing:
                start = self._scale_started or time.perf_counter()
                self.last_scale_s = time.perf_counter() - start
                return self.last_scale_s
            if deadline is not None and time.monotonic() > deadline:
                ids = self.job_ids()
                detail = ", ".join(
                    f"{w} (job {ids.get(w if w in ids else w.rsplit('-', 1)[0]) or '?'})"
                    for w in missing
                )
                raise PoolsTimeoutError(
                    f"{len(missing)} worker(s) not connected after {timeout:g} s: {detail}; "
                    "they may still be queued, or failed: see the batch system's queue and "
                    "the jobs' log files (log_directory)"
                )
            time.sleep(poll)

    def __repr__(self) -> str:
        pools = "; ".join(p.describe() for p in self.pools.values())
        return f"{type(self).__name__}({getattr(self, 'scheduler_address', '?')!r}, {pools})"


_POOLED_CLASSES: dict[str, type] = {}


def pooled_cluster_class(kind: str) -> type:
    """The pools cluster class of a batch system, e.g. ``PooledSLURMCluster``."""
    kind = _check_kind(kind, JOBQUEUE_KINDS)
    if kind not in _POOLED_CLASSES:
        _job_class(kind)  # the import error, if any
        import dask_jobqueue
        from dask_jobqueue.local import LocalCluster as JQLocalCluster

        base = {
            "slurm": dask_jobqueue.SLURMCluster,
            "pbs": dask_jobqueue.PBSCluster,
            "sge": dask_jobqueue.SGECluster,
            "lsf": dask_jobqueue.LSFCluster,
            "local": JQLocalCluster,
        }[kind]
        name = "Pooled" + base.__name__.replace("Cluster", "") + "Cluster"
        if kind == "local":
            name = "PooledLocalJobCluster"
        _POOLED_CLASSES[kind] = type(
            name,
            (PooledJobCluster, base),
            {"kind": kind, "__module__": __name__, "__doc__": PooledJobCluster.__doc__},
        )
    return _POOLED_CLASSES[kind]


def start_pools(
    kind: str,
    pools: Iterable[PoolSpec],
    *,
    wait: bool = True,
    timeout: float | None = 600.0,
    **common: Any,
) -> PooledJobCluster:
    """Start one scheduler and the jobs of every pool on a batch system.

    Parameters
    ----------
    kind : {"slurm", "pbs", "sge", "lsf", "local"}
        Batch system (``"local"``: jobs are local processes; for trying and tests).
    pools : iterable of PoolSpec
        The pools; names must be unique.
    wait : bool, default=True
        Block until every worker of every pool is connected.
    timeout : float or None, default=600
        Seconds to wait when ``wait``; on expiry the cluster is closed (its jobs
        cancelled) and :class:`PoolsTimeoutError` raised.
    **common
        Keywords of the dask-jobqueue cluster class (``interface``, ``walltime``,
        ``log_directory``, ``death_timeout``, ``python``, ``scheduler_options``, ``account``,
        ``job_script_prologue``, ...), common to every pool; a pool's own settings override
        them (lists such as ``job_extra_directives`` add up). Anything set nowhere comes
        from Dask's ``jobqueue.<kind>`` configuration. The scheduler's dashboard takes a
        free port unless ``scheduler_options`` says otherwise.

    Returns
    -------
    cluster : PooledJobCluster
        Running; ``cluster.last_scale_s`` holds the seconds from submission to all
        workers connected when ``wait``.

    Examples
    --------
    >>> pools = [PoolSpec("small", count=2, cores=1, memory="2GiB", processes=1),
    ...          PoolSpec("big", cores=8, memory="32GiB", processes=1, queue="fat")]
    >>> cluster = start_pools("slurm", pools, walltime="01:00:00")  # doctest: +SKIP
    >>> client = Client(cluster)  # doctest: +SKIP
    """
    cluster = pooled_cluster_class(kind)(pools, **common)
    if wait:
        try:
            cluster.wait_for_pools(timeout)
        except BaseException:
            cluster.close()
            raise
    return cluster


# ---------------------------------------------------------------------- configuration
@dataclass
class ClusterConfig:
    """A pools configuration, as read from a pools file.

    Attributes
    ----------
    kind : str
        ``"local"``, ``"slurm"``, ``"pbs"``, ``"sge"`` or ``"lsf"``.
    pools : list of PoolSpec
        Empty means: no pools file (``local``: the emulated local cluster of ``--speeds``).
    common : dict
        Common keywords of :func:`start_pools`.
    wait_timeout : float or None
        Seconds to wait for every worker to connect.
    """

    kind: str
    pools: list[PoolSpec] = field(default_factory=list)
    common: dict[str, Any] = field(default_factory=dict)
    wait_timeout: float | None = 600.0

    def describe(self) -> str:
        """One line: the kind and every pool."""
        return f"{self.kind} pools: " + "; ".join(p.describe() for p in self.pools)


def cluster_config_from_dict(data: Mapping[str, Any], kind: str | None = None) -> ClusterConfig:
    """A :class:`ClusterConfig` from the mapping of a pools file.

    The mapping has ``cluster`` (the kind), ``pools`` (a mapping of name to pool
    settings, or a list of pools with a ``name``), optional ``common`` (keywords of
    :func:`start_pools`) and ``wait-timeout`` (seconds). Keys may be
    ``kebab-case``, as in Dask's ``jobqueue.yaml``.

    Parameters
    ----------
    data : mapping
        Parsed YAML.
    kind : str, optional
        The ``--cluster`` of the command line: it must agree with the file's ``cluster``
        when both are given.
    """
    if not isinstance(data, Mapping):
        raise ClusterConfigError("a pools file must hold a mapping (cluster, common, pools)")
    data = _snake_keys(data)
    unknown = sorted(set(data) - {"cluster", "kind", "pools", "common", "wait_timeout"})
    if unknown:
        raise ClusterConfigError(
            f"unknown key(s) in the pools file: {', '.join(unknown)} "
            "(expected cluster, common, pools, wait-timeout)"
        )
    file_kind = data.get("cluster", data.get("kind"))
    if kind is not None and file_kind is not None and kind != file_kind:
        raise ClusterConfigError(
            f"--cluster {kind} disagrees with the pools file's cluster: {file_kind}"
        )
    kind = _check_kind(kind or file_kind or "", CLUSTER_KINDS) if (kind or file_kind) else None
    if kind is None:
        raise ClusterConfigError("say which batch system: cluster: slurm (or --cluster)")
    raw = data.get("pools")
    if isinstance(raw, Mapping):
        pools = [PoolSpec.from_dict(spec or {}, name=str(name)) for name, spec in raw.items()]
    elif isinstance(raw, list):
        pools = [PoolSpec.from_dict(spec) for spec in raw]
    else:
        raise ClusterConfigError("the pools file needs pools: a mapping of name to settings")
    if not pools:
        raise ClusterConfigError("the pools file has no pool")
    _check_pools(pools)
    common = data.get("common") or {}
    if not isinstance(common, Mapping):
        raise ClusterConfigError("common: must be a mapping of settings")
    timeout = data.get("wait_timeout", 600.0)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise ClusterConfigError(f"wait-timeout must be positive seconds, got {timeout!r}")
    return ClusterConfig(kind, pools, _snake_keys(common), timeout)


def load_cluster_config(path: str | Path | None = None, kind: str | None = None) -> ClusterConfig:
    """Read a pools file, or build the default configuration of ``kind`` without one.

    Parameters
    ----------
    path : str or Path, optional
        YAML pools file (see ``examples/pools.yaml``).
    kind : str, optional
        ``--cluster``. Without a file: ``"local"`` means the emulated local cluster
        (no pools); a batch system means one pool ``default`` of two jobs whose
        settings all come from Dask's ``jobqueue.<kind>`` configuration.
    """
    if path is None:
        if kind is None:
            return ClusterConfig("local")
        kind = _check_kind(kind, CLUSTER_KINDS)
        if kind == "local":
            return ClusterConfig("local")
        return ClusterConfig(kind, [PoolSpec("default", count=2)])
    import yaml

    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"pools file not found: {path}")
    try:
        data = yaml.safe_load(source.read_text())
    except yaml.YAMLError as exc:
        raise ClusterConfigError(f"cannot parse {path}: {exc}") from None
    try:
        return cluster_config_from_dict(data, kind)
    except ClusterConfigError as exc:
        raise ClusterConfigError(f"{path}: {exc}") from None


# ----------------------------------------------------------------------- command line
def _config_from_args(args: argparse.Namespace) -> ClusterConfig:
    return load_cluster_config(
        getattr(args, "cluster_config", None), getattr(args, "cluster", None)
    )


def cmd_cluster_dry_run(args: argparse.Namespace) -> int:
    """Print the job script of every pool of ``--cluster``/``--cluster-config``; submit nothing.

    Returns
    -------
    exit_code : int
        0.
    """
    config = _config_from_args(args)
    if not config.pools:
        from hmdspt.parallel.cluster import DEFAULT_SPEEDS

        speeds = getattr(args, "speeds", None) or DEFAULT_SPEEDS
        print(
            "cluster: local, heterogeneity emulated on one machine "
            f"(speeds {', '.join(f'{s:g}' for s in speeds)}); no job scripts"
        )
        return 0
    scripts = pool_job_scripts(config.kind, config.pools, **config.common)
    print(f"cluster: {config.describe()}")
    for pool in config.pools:
        print(f"\n# ---- pool {pool.describe()}")
        print(scripts[pool.name].rstrip())
    return 0


def client_from_args(args: argparse.Namespace) -> tuple[ExitStack, Any, str]:
    """A client for ``--scheduler``, ``--cluster``/``--cluster-config`` or ``--speeds``.

    Parameters
    ----------
    args : argparse.Namespace
        With ``cluster`` and ``cluster_config`` (:func:`add_cluster_arguments`), and the
        CLI's ``scheduler`` and ``speeds`` if it has them.

    Returns
    -------
    stack : contextlib.ExitStack
        Closing it closes the client and the cluster (cancelling its jobs).
    client : distributed.Client
    label : str
        What the cluster is, for the user (pools, scheduler, start-up time).
    """
    from distributed import Client

    scheduler = getattr(args, "scheduler", None)
    kind = getattr(args, "cluster", None)
    path = getattr(args, "cluster_config", None)
    if scheduler and (path or kind not in (None, "local")):
        raise ClusterConfigError("give either --scheduler or --cluster/--cluster-config")
    stack = ExitStack()
    try:
        if scheduler:
            from hmdspt.parallel.cluster import connect

            client = stack.enter_context(connect(scheduler))
            return stack, client, f"scheduler {scheduler}"
        config = _config_from_args(args)
        if not config.pools:
            from hmdspt.parallel.cluster import DEFAULT_SPEEDS, local_cluster

            speeds = getattr(args, "speeds", None) or DEFAULT_SPEEDS
            cluster = stack.enter_context(local_cluster(speeds=speeds))
            client = stack.enter_context(Client(cluster))
            label = f"local cluster, heterogeneity emulated on one machine (speeds {speeds})"
            return stack, client, label
        cluster = stack.enter_context(
            start_pools(
                config.kind,
                config.pools,
                wait=True,
                timeout=config.wait_timeout,
                **config.common,
            )
        )
        client = stack.enter_context(Client(cluster))
        n = sum(len(v) for v in cluster.workers_by_pool().values())
        label = (
            f"{config.describe()}; {n} workers connected in {cluster.last_scale_s:.1f} s "
            f"(scheduler {cluster.scheduler_address})"
        )
        return stack, client, label
    except BaseException:
        stack.close()
        raise
