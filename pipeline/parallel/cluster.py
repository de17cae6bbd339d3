"""Getting a Dask cluster: an emulated heterogeneous local one, or an existing one.

:func:`local_cluster` starts a real ``distributed.LocalCluster`` with one worker process
per requested speed; each worker emulates its relative speed with a duty-cycle throttle
(the slowdown held by its :class:`hmdspt.parallel.worker.HMDSPTWorkerPlugin`, which the
scheduler gives every worker). Workers are named neutrally (``worker-0``, ``worker-1``,
...): the scorer must measure speeds, never read them. The emulation is recorded in the
cluster's ``emulation`` attribute and shown in its repr, so that every result computed on
it can be labelled as emulated.

:func:`connect` turns whatever the user passed (a client, a cluster, a scheduler address or
file, or nothing) into a ``distributed.Client``; :func:`connected` closes what it opened.
Pools of batch jobs on a shared cluster (SLURM, PBS, SGE, LSF) are
:mod:`hmdspt.parallel.pools`, which builds on this module (never the reverse).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster, WorkerPlugin
from distributed.protocol.pickle import dumps
from distributed.security import Security
from distributed.worker_memory import parse_memory_limit

from hmdspt.core.process import importing_the_main_script_in_a_child
from hmdspt.parallel.worker import MAX_SLOWDOWN, HMDSPTWorkerPlugin

__all__ = [
    "Emulation",
    "EmulatedLocalCluster",
    "check_speeds",
    "connect",
    "connect_timeout_s",
    "connected",
    "local_cluster",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Emulation:
    """How a local cluster emulates heterogeneous workers.

    Attributes
    ----------
    speeds : dict of str to float
        Requested relative speed per worker name, as passed to :func:`local_cluster`.
    slowdowns : dict of str to float
        Slowdown factor ``k = max(speeds) / speed`` applied to each worker.
    method : str
        How the slowdown is applied.
    """

    speeds: dict[str, float]
    slowdowns: dict[str, float]
    method: str = "duty cycle: sleep (k-1) x thread CPU time of each compute chunk"

    def __str__(self) -> str:
        ratio = ":".join(f"{s:g}" for s in self.speeds.values())
        return f"emulated speeds {ratio} ({self.method})"


class EmulatedLocalCluster(LocalCluster):
    """A ``LocalCluster`` whose workers emulate different speeds; see :func:`local_cluster`.

    Attributes
    ----------
    emulation : Emulation
        The emulated speeds and slowdowns by worker name.
    """

    emulation: Emulation | None = None

    def _new_worker_name(self, worker_number: int) -> str:
        # Workers added later by ``scale`` are named alike (and run unthrottled: the
        # emulation gives no slowdown to their names).
        return f"worker-{worker_number}"

    def __repr__(self) -> str:
        text = super().__repr__()
        return f"{text[:-1]}, {self.emulation})" if self.emulation else text


def check_speeds(speeds: Iterable[float]) -> tuple[float, ...]:
    """The relative speeds of an emulated cluster as floats, checked.

    Raises
    ------
    ValueError
        If ``speeds`` is empty, holds anything but positive finite numbers, or asks for a
        worker more than :data:`~hmdspt.parallel.worker.MAX_SLOWDOWN` times slower than
        the fastest.
    """
    if isinstance(speeds, (str, bytes)) or not isinstance(speeds, Iterable):
        raise ValueError(f"speeds must be a sequence of positive numbers, got {speeds!r}")
    speeds = tuple(speeds)
    if len(speeds) == 0:
        raise ValueError("speeds must hold at least one worker speed, got an empty sequence")
    checked = []
    for s in speeds:
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"every speed must be a positive finite number, got {speeds!r}")
        checked.append(float(s))
    if max(checked) / min(checked) > MAX_SLOWDOWN:
        raise ValueError(
            f"speeds {speeds!r}: the slowest worker would run {max(checked) / min(checked):.4g}x "
            f"slower than the fastest; the emulation slows a worker down {MAX_SLOWDOWN:g}x at most"
        )
    return tuple(checked)


# The emulated local cluster's relative speeds when none are given (the CLI's too).
DEFAULT_SPEEDS = (4.0, 2.0, 1.0)


def local_cluster(
    speeds: Sequence[float] | None = None,
    threads_per_worker: int = 1,
    *,
    n_workers: int | None = None,
    processes: bool = True,
    dashboard_address: str | None = None,
    silence_logs: int | bool = logging.WARNING,
    memory_limit: str | float | None = "auto",
    blas_threads: int | None = 1,
    numpy_huge_pages: bool | None = False,
    timeout: float = 60.0,
    **kwargs: Any,
) -> EmulatedLocalCluster:
    """Start a local Dask cluster whose workers emulate the given relative speeds.

    Parameters
    ----------
    speeds : sequence of float, optional
        One worker per entry; worker ``i`` runs at ``speeds[i] / max(speeds)`` of the
        machine's speed (slowdown ``k_i = max(speeds) / speeds[i]``). Three workers at
        4:2:1 need 1 + 0.5 + 0.25 = 1.75 cores; keep the sum of relative speeds times
        ``threads_per_worker`` under the core count or contention distorts the ratios.
        None: ``n_workers`` workers at full speed if ``n_workers`` is given, else
        :data:`DEFAULT_SPEEDS` (4, 2, 1).
    threads_per_worker : int, default=1
        Threads of each worker.
    n_workers : int, optional
        Number of workers, as for ``distributed.LocalCluster``: without ``speeds``, that
        many workers at full speed (no emulated slowdown); with ``speeds``, it must equal
        ``len(speeds)``.
    processes : bool, default=True
        One process per worker (separate GILs, as separate machines would have).
    dashboard_address : str or None, default=None
        Scheduler dashboard; None turns it off (tests, shared machines) and puts the
        scheduler's remaining HTTP endpoints on a free port; ``":0"`` serves the dashboard
        on a free port.
    silence_logs : int or bool, default=logging.WARNING
        Log level of the cluster's loggers, as for ``LocalCluster``.
    memory_limit : str, float or None, default="auto"
        Per worker; "auto" shares the machine's memory equally among the workers.
    blas_threads : int or None, default=1
        BLAS threads per worker process (see
        :class:`~hmdspt.parallel.worker.HMDSPTWorkerPlugin`).
    numpy_huge_pages : bool or None, default=False
        Whether each worker's numpy asks the kernel for transparent huge pages; None leaves
        it as numpy set it (see :class:`~hmdspt.parallel.worker.HMDSPTWorkerPlugin`).
    timeout : float, default=60.0
        Seconds to wait for all workers to start.
    **kwargs
        Passed on to ``distributed.LocalCluster``.

    Returns
    -------
    cluster : EmulatedLocalCluster
        Started, with all workers connected. Use it as a context manager or ``close()`` it.
        Workers are named ``worker-0``, ``worker-1``, ... in the order of ``speeds``;
        ``cluster.emulation`` records the emulated speeds. A worker that restarts gets its
        slowdown back; one added later (``cluster.scale``) runs at full speed.

    Raises
    ------
    ValueError
        If ``speeds`` is empty or holds anything but positive finite numbers, or
        ``n_workers`` is not a positive integer or disagrees with ``len(speeds)``.

    Examples
    --------
    >>> from distributed import Client
    >>> with local_cluster((4, 2, 1)) as cluster, Client(cluster) as client:  # doctest: +SKIP
    ...     print(cluster.emulation)
    emulated speeds 4:2:1 (duty cycle: ...)
    """
    if processes and importing_the_main_script_in_a_child():
        # The script called us unguarded, so each worker process re-runs it on start; a
        # process cannot start others then (Python refuses), and the driver would wait out
        # ``timeout`` and print a traceback per process.
        # Written, not raised as SystemExit's message: a forkserver's child drops that. One
        # write, so that the processes' lines do not interleave.
        sys.stderr.write(
            "hmdspt: local_cluster() ran again in a worker process as it imported the script "
            'that starts the cluster: call it under `if __name__ == "__main__":`\n'
        )
        sys.stderr.flush()
        raise SystemExit(1)
    speeds = _speeds_for(speeds, n_workers)
    n = len(speeds)
    fastest = max(speeds)
    names = [f"worker-{i}" for i in range(n)]
    slowdowns = {name: fastest / s for name, s in zip(names, speeds)}
    if memory_limit == "auto":
        memory_limit = parse_memory_limit("auto", 1, n, logger=logger)

    if dashboard_address is None:
        # Without a dashboard the scheduler still serves /health and /metrics, on port 8787
        # unless told otherwise: take a free port so that clusters side by side (tests, other
        # users of a shared machine) do not fight over it.
        scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
        scheduler_kwargs.setdefault("dashboard_address", ":0")
        kwargs["scheduler_kwargs"] = scheduler_kwargs

    # Start with no worker, give the scheduler the workers' plugin (slowdowns by worker name),
    # then start the workers: each sets the plugin up as it registers, before it handles
    # any task, so nothing ever runs unthrottled; one that joins or restarts later gets it
    # too, and a fit's idempotent registration of the plugin is then a no-op.
    earlier = _worker_processes() if processes else None  # (see _close_after_failure)
    cluster = None
    try:
        with _sigint_blocked_in_threads_started(processes):
            cluster = EmulatedLocalCluster(
                n_workers=0,
                threads_per_worker=threads_per_worker,
                processes=processes,
                dashboard_address=dashboard_address,
                silence_logs=silence_logs,
                memory_limit=memory_limit,
                **kwargs,
            )
        cluster.emulation = Emulation(dict(zip(names, speeds)), slowdowns)
        plugin = HMDSPTWorkerPlugin(
            slowdowns, blas_threads=blas_threads, numpy_huge_pages=numpy_huge_pages
        )
        plugins = [plugin]
        if processes:
            # Each worker's own process: its loggers end with it. (In-process workers log on
            # the caller's loggers, which outlive the cluster: left as they are.)
            plugins.append(QuietWorkerLogsPlugin(compute_failed=False))
            plugins.append(DriverInterruptsPlugin())
        for p in plugins:
            cluster.sync(
                cluster.scheduler_comm.register_worker_plugin,
                plugin=dumps(p),
                name=p.name,
                idempotent=False,
            )
        _start_workers(cluster, n, timeout)
    except BaseException:
        if cluster is not None:
            _close_after_failure(cluster, earlier)
        raise
    return cluster


@contextmanager
def _sigint_blocked_in_threads_started(on: bool) -> Iterator[None]:
    """Block SIGINT in this thread while the block runs (if ``on``, where the OS can).

    A thread inherits its creator's signal mask, and a process the mask of the thread that
    started it, through ``exec``. The cluster's event-loop thread, started in the block,
    starts every worker process; each then begins with SIGINT blocked and never gets the
    Ctrl-C a terminal sends its whole process group. Ignoring SIGINT once the worker is set
    up (:class:`DriverInterruptsPlugin`) left its interpreter's start: one Ctrl-C in 20
    there printed a worker's ``KeyboardInterrupt`` traceback. A SIGINT that arrives for
    this thread meanwhile is held and raised as the block ends.

    multiprocessing's resource tracker is started first: the thread that starts it ends
    with SIGINT unblocked (``ensure_running`` unblocks what it blocked for its own start),
    and the cluster's event-loop thread would otherwise be that thread.
    """
    if not on or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _speeds_for(speeds: Sequence[float] | None, n_workers: int | None) -> tuple[float, ...]:
    """:func:`local_cluster`'s checked speeds from its ``speeds`` and ``n_workers``."""
    if n_workers is not None and (
        isinstance(n_workers, bool) or not isinstance(n_workers, numbers.Integral) or n_workers < 1
    ):
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
    if speeds is None:
        return DEFAULT_SPEEDS if n_workers is None else (1.0,) * int(n_workers)
    checked = check_speeds(speeds)
    if n_workers is not None and n_workers != len(checked):
        raise ValueError(
            f"n_workers={n_workers!r} disagrees with speeds {speeds!r} ({len(checked)} "
            "workers): give one of them, or as many speeds as workers"
        )
    return checked


def _close_after_failure(cluster: LocalCluster, earlier: set[int] | None) -> None:
    """Close a cluster whose start failed or was interrupted, keeping the cause.

    distributed's ``close`` asserts on workers still starting (``AssertionError:
    Status.init``), which would replace the caller's ``KeyboardInterrupt`` or error, and the
    process of a worker that was starting as the close began outlives it (until the
    driver's exit reaps it). So the close's own error is dropped, and the worker processes
    under this one that were not there before the start (``earlier``,
    :func:`_worker_processes`; None for in-process workers) are ended, until none has come
    up for a second. They are not reaped here: distributed reads their exit status. Another
    cluster of this process starting workers at the same moment would lose those too:
    nothing in a started process names its cluster.
    """
    _drop_failed_starts_on(getattr(cluster.loop, "asyncio_loop", None))
    with contextlib.suppress(Exception):
        cluster.close()
    if earlier is None:  # in-process workers: no process to end
        return
    quiet, deadline = 0, time.monotonic() + LATE_WORKER_WAIT_S
    while quiet < 10 and time.monotonic() < deadline:  # none for a second
        late = _worker_processes() - earlier
        for pid in late:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        quiet = 0 if late else quiet + 1
        time.sleep(0.1)


def _worker_processes() -> set[int]:
    """Running ``multiprocessing`` processes under this one, but its servers (a forkserver,
    the resource tracker). By process id: a process's start time, as the kernel counts it,
    can read a tenth of a second or more off ``time.time()``."""
    import psutil  # distributed's own dependency

    me = psutil.Process()
    found = set()
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(p.cmdline())
            server = p.ppid() == me.pid and ("forkserver" in line or "resource_tracker" in line)
            if "multiprocessing" in line and not server:  # a forkserver's children carry its line
                found.add(p.pid)
    return found


def _drop_failed_starts_on(loop: asyncio.AbstractEventLoop | None) -> None:
    """Keep the start tasks this close ends from being reported as never retrieved.

    distributed's tasks that start the nannies fail as their processes are ended, and the
    event loop logs each as "Task exception was never retrieved" with two tracebacks when it
    is collected: noise after the interrupt the caller already gets. Other reports pass on.
    """
    if loop is None:
        return
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if isinstance(error, RuntimeError) and str(error).endswith("failed to start."):
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    loop.set_exception_handler(handler)


#: Seconds :func:`_close_after_failure` looks for worker processes a start left behind.
LATE_WORKER_WAIT_S = 10.0


def _start_workers(cluster: LocalCluster, n: int, timeout: float) -> None:
    """Start ``n`` workers and wait for them; a worker process that fails to start fails
    this at once (``scale`` and ``wait_for_workers`` would wait out ``timeout``)."""
    while len(cluster.worker_spec) < n:
        cluster.worker_spec.update(cluster.new_worker_spec())

    async def start() -> None:
        await asyncio.wait_for(cluster._correct_state(), timeout)

    try:
        cluster.sync(start)
    except RuntimeError as exc:  # distributed's "Nanny failed to start."
        raise RuntimeError(
            f"the cluster's worker processes failed to start ({exc}); their errors are above"
        ) from None
    cluster.wait_for_workers(n, timeout=timeout)


#: The worker loggers :class:`QuietWorkerLogsPlugin` filters (a logger's filters see only
#: its own records, not its children's).
QUIETED_WORKER_LOGGERS = ("distributed.worker", "distributed.worker.state_machine")

# Records that only say a worker is closing under something in flight.
_NOISE_OF_A_CLOSING_WORKER = ("Failed to communicate with scheduler", "Async instruction for ")


class QuietWorkerLogs(logging.Filter):
    """Drops records of a worker that only add noise (installed by
    :class:`QuietWorkerLogsPlugin`).

    - "Compute Failed", with ``compute_failed=True`` (``hmdspt``'s commands): a task that
      raised (a NaN a worker read); the fit stops and the command names the error.
    - "Failed to communicate with scheduler during heartbeat", once the worker is closing:
      a heartbeat still in flight when the worker closes its connections as its cluster
      closes (seen in runs of ``hmdspt train`` and of the README's cluster example;
      distributed issue 7105).
    - "Async instruction for <Task ...> ended with CancelledError", once the worker is
      closing (``distributed.worker.state_machine``): a task still running when the
      command closes its cluster, such as another worker's read of its block after one
      worker's read failed (it failed a run of the test suite in a fresh venv).
    """

    def __init__(self, worker: Any, compute_failed: bool = True) -> None:
        super().__init__()
        self.worker = worker
        self.compute_failed = compute_failed

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if self.compute_failed and message.startswith("Compute Failed"):
            return False
        closing = self.worker.status.name not in ("running", "paused")
        return not (closing and message.startswith(_NOISE_OF_A_CLOSING_WORKER))


class QuietWorkerLogsPlugin(WorkerPlugin):
    """Installs :class:`QuietWorkerLogs` on each worker of a cluster ``hmdspt`` started:
    every record it drops for the commands' clusters, only a closing worker's noise for
    :func:`local_cluster`'s (``compute_failed=False``: a user's own tasks fail on it as
    they would elsewhere). Not on a cluster the commands connect to: its logs are its owner's.

    The filter stays when the worker closes: the heartbeat record comes after the
    plugins' teardown, and a worker process ends with its worker.
    """

    idempotent = True

    def __init__(self, compute_failed: bool = True) -> None:
        self.compute_failed = compute_failed
        # One name per kind, so that the commands' plugin is not taken for the one
        # local_cluster registered before it (an idempotent name registers once).
        self.name = "hmdspt-quiet-worker-logs" + ("" if compute_failed else "-closing")

    def setup(self, worker: Any) -> None:
        for name in QUIETED_WORKER_LOGGERS:
            logger = logging.getLogger(name)
            if not any(
                isinstance(f, QuietWorkerLogs) and f.compute_failed == self.compute_failed
                for f in logger.filters
            ):
                logger.addFilter(QuietWorkerLogs(worker, self.compute_failed))


class DriverInterruptsPlugin(WorkerPlugin):
    """Makes each worker process of a cluster ``hmdspt`` started ignore SIGINT.

    A Ctrl-C at the terminal goes to its whole process group: the driver and the worker
    processes it started. The driver handles it (a fit stops and reports, a command ends
    with one line) and closes the cluster; each worker process had also printed its own
    ``KeyboardInterrupt`` traceback. Only in a worker process of its own (one with a
    nanny), from its main thread: an in-process worker's SIGINT is its driver's.
    """

    idempotent = True
    name = "hmdspt-driver-interrupts"

    def setup(self, worker: Any) -> None:
        if worker.nanny is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def check_open(client: Client) -> None:
    """Raise ValueError if ``client`` is closed or closing.

    A closed client would fail much later, deep inside the first call, with an
    AttributeError.
    """
    if client.status in ("closing", "closed"):
        raise ValueError(
            f"client is closed (status {client.status!r}); pass an open distributed.Client"
        )


def connect(target: Client | str | Any | None = None, security: Security | None = None) -> Client:
    """A ``distributed.Client`` for whatever names the cluster to use.

    Parameters
    ----------
    target : Client, cluster, str, path or None, default=None
        - a ``Client``: returned as is;
        - a cluster object (``LocalCluster``, ``SLURMCluster``, ...): a new client of it;
        - a scheduler address such as ``"tcp://10.0.0.5:8786"`` or ``"tls://..."``;
        - the path of a scheduler file (``dask scheduler --scheduler-file``);
        - None: the current default client if there is one, else a new client of a new
          default ``LocalCluster`` (not emulated; see :func:`local_cluster` for that).
    security : distributed.security.Security, optional
        TLS settings for a scheduler address (``tls://``). Clusters bring their own.

    Returns
    -------
    client : distributed.Client
        Close it when done unless it is the client that was passed in.

    Raises
    ------
    ValueError
        If ``target`` is a Client that is closed or closing.
    ConnectionError
        If no scheduler answers within Dask's ``distributed.comm.timeouts.connect``.
    TypeError
        If ``target`` is none of the above.
    """
    if isinstance(target, Client):
        check_open(target)
        return target
    if target is None:
        try:
            return Client.current()
        except ValueError:
            return Client(security=security)
    if isinstance(target, (str, os.PathLike)):
        return _client_of_address(target, security)
    if hasattr(target, "scheduler_address"):
        return Client(target)
    raise TypeError(
        "client must be a distributed.Client, a cluster, a scheduler address, a scheduler "
        f"file or None, got {type(target).__name__}"
    )


def connect_timeout_s() -> float:
    """Seconds :func:`connect` waits for a scheduler (``distributed.comm.timeouts.connect``)."""
    import dask

    return float(dask.utils.parse_timedelta(dask.config.get("distributed.comm.timeouts.connect")))


def _client_of_address(target: str | os.PathLike, security: Security | None) -> Client:
    """A Client of a scheduler address or scheduler file, failing in one line."""
    timeout = connect_timeout_s()
    text = os.fspath(target)
    is_file = "://" not in text and Path(text).is_file()
    where = f"scheduler file {text}" if is_file else f"Dask scheduler at {text}"
    try:
        if is_file:
            return Client(scheduler_file=text, security=security, timeout=timeout)
        if "://" not in text and ":" not in text:
            raise ValueError(f"{text!r} is neither a scheduler address nor an existing file")
        return Client(text, security=security, timeout=timeout)
    except (OSError, TimeoutError) as error:
        # Dask's own message spans lines of retries; one line names what failed.
        raise ConnectionError(
            f"could not connect to the {where} within {timeout:g} s (Dask setting "
            f"distributed.comm.timeouts.connect): {_first_line(error)}"
        ) from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


@contextmanager
def connected(
    target: Client | str | Any | None = None, security: Security | None = None
) -> Iterator[Client]:
    """:func:`connect` for the length of a ``with`` block, closing what it opened.

    A Client passed in, or the current default client, stays open; a client opened here
    (of a cluster, an address, a scheduler file) is closed on leaving the block.
    """
    reused = target if isinstance(target, Client) else None
    if target is None:
        try:
            reused = Client.current()
        except ValueError:
            pass
    client = connect(target, security)
    try:
        yield client
    finally:
        if client is not reused:
            client.close()
