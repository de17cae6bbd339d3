"""What a fit sets up on the cluster and takes down when it ends, whatever ends it.

A fit keeps state on the workers between rounds (on their
:class:`hmdspt.parallel.worker.HMDSPTWorkerPlugin`) and scatters ``w_t`` to them under keys
named after the run (:func:`hmdspt.parallel.worker.run_key`). The trainer drops both at its
clean-up (:func:`close_run`), whether the fit completed, stopped or failed. A driver that
dies has no clean-up, so the scheduler does it: :class:`RunOwnersPlugin` knows which client
owns which run and, when that client disconnects, has every worker end its runs
(:func:`hmdspt.parallel.worker.drop_runs`). :func:`open_run` registers both plugins
(idempotently) at the start of every fit: a cluster that has them keeps them as they are
(see :class:`~hmdspt.parallel.worker.HMDSPTWorkerPlugin`).

:func:`deferred_interrupts` holds Ctrl-C back while the trainer writes ``run_end`` and
cleans up, so a second interrupt cannot cut that short. :class:`InterruptWatch` keeps a
Ctrl-C during training from being lost when its ``KeyboardInterrupt`` lands in a finalizer.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from distributed import SchedulerPlugin
from distributed.protocol.pickle import dumps

from hmdspt.core.callers import user_stacklevel
from hmdspt.parallel.worker import HMDSPTWorkerPlugin, drop_run_state, drop_runs

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, Scheduler

__all__ = [
    "RUN_OWNERS_PLUGIN_NAME",
    "DeferredInterrupts",
    "InterruptWatch",
    "RunOwnersPlugin",
    "close_run",
    "deferred_interrupts",
    "open_run",
]

RUN_OWNERS_PLUGIN_NAME = "hmdspt-run-owners"


class RunOwnersPlugin(SchedulerPlugin):
    """Scheduler plugin: when a driver's client disconnects, its runs end on every worker.

    The trainer records each run's owner at fit start (:func:`open_run`) and forgets it
    at its clean-up (:func:`close_run`). A client that leaves with runs still recorded
    (its process died, or lost the connection) had no clean-up: the plugin broadcasts
    :func:`hmdspt.parallel.worker.drop_runs` to the workers, as ``Client.run`` would, and
    each worker drops the runs' state and frees their keys. The scheduler has already
    released the client's futures by then; what this frees is what it never knew of
    (the tail of an interrupted broadcast) and the state outside Dask's data.
    """

    name = RUN_OWNERS_PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}  # run id -> client id
        self._drops: set[asyncio.Task] = set()  # kept referenced until done

    def remove_client(self, scheduler: Scheduler, client: str) -> None:
        run_ids = sorted(r for r, owner in self.owners.items() if owner == client)
        if not run_ids:
            return
        for run_id in run_ids:
            del self.owners[run_id]
        task = asyncio.ensure_future(self._drop(scheduler, run_ids, client))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    @staticmethod
    async def _drop(scheduler: Scheduler, run_ids: list[str], client: str) -> None:
        await scheduler.broadcast(
            msg={
                "op": "run",
                "function": dumps(drop_runs),
                "args": dumps((run_ids, client)),
                "kwargs": dumps({}),
                "wait": True,
            },
            on_error="ignore",  # a worker that is gone holds nothing
        )


def _note_owner(run_id: str, owner: str, dask_scheduler: Scheduler) -> bool:
    plugin = dask_scheduler.plugins.get(RUN_OWNERS_PLUGIN_NAME)
    if plugin is None:
        return False
    plugin.owners[run_id] = owner
    return True


def _forget_owner(run_id: str, dask_scheduler: Scheduler) -> None:
    plugin = dask_scheduler.plugins.get(RUN_OWNERS_PLUGIN_NAME)
    if plugin is not None:
        plugin.owners.pop(run_id, None)


def open_run(client: Client, run_id: str) -> bool:
    """Set a fit up on the cluster: the plugins (once per cluster) and the run's owner.

    Parameters
    ----------
    client : distributed.Client
        The driver's client; its id is recorded as the run's owner.
    run_id : str
        The fit's run id.

    Returns
    -------
    owner_recorded : bool
        False, after one warning, when the scheduler could not take
        :class:`RunOwnersPlugin` (e.g. it cannot import ``pipeline``): the fit goes on,
        but a driver that dies then leaves its run state on the workers.
    """
    # No slowdown given: a worker keeps the one it has. The workers need hmdspt anyway.
    client.register_plugin(HMDSPTWorkerPlugin())
    try:
        client.register_plugin(RunOwnersPlugin())
        return bool(client.run_on_scheduler(_note_owner, run_id, client.id))
    except Exception as exc:
        warnings.warn(
            f"the scheduler could not take the HMDSPT run-owner plugin ({exc!r}); if this "
            "driver dies, its run state stays on the workers until they restart",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return False


def close_run(client: Client, run_id: str, owner_recorded: bool = True) -> None:
    """End a fit on the cluster: every worker drops the run's state and frees its keys.

    Workers that are gone are skipped. Raises what the client raises when the scheduler
    cannot be reached.
    """
    client.run(drop_run_state, run_id, on_error="ignore")
    if owner_recorded:
        client.run_on_scheduler(_forget_owner, run_id)


class DeferredInterrupts:
    """The SIGINTs :func:`deferred_interrupts` held back (see :meth:`replay`)."""

    def __init__(self, handler: Any = None) -> None:
        self.handler = handler
        self.signals: list[tuple[int, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.signals)

    def replay(self) -> None:
        """Run the handler the first held SIGINT would have run (the default one raises
        KeyboardInterrupt)."""
        if self.signals and callable(self.handler):
            self.handler(*self.signals[0])


@contextmanager
def deferred_interrupts() -> Iterator[DeferredInterrupts]:
    """Hold SIGINT back while the block runs; what was held is in the object yielded.

    Only the main thread receives SIGINT and sets its handler: elsewhere, and when SIGINT
    is ignored or left to the system, nothing is deferred.
    """
    if threading.current_thread() is not threading.main_thread():
        yield DeferredInterrupts()
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        yield DeferredInterrupts()
        return
    held = DeferredInterrupts(handler)
    signal.signal(signal.SIGINT, lambda signum, frame: held.signals.append((signum, frame)))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, handler)


class InterruptWatch:
    """Remember each Ctrl-C of a fit, so one a finalizer swallowed still stops it.

    Python runs the SIGINT handler wherever the main thread is, also inside an object's
    ``__del__`` (distributed's ``Future.__del__`` runs often during a fit); there the
    ``KeyboardInterrupt`` is printed as "Exception ignored" and the fit goes on.
    :meth:`install` wraps the SIGINT handler so that an interrupt it raises is noted;
    :meth:`raise_if_swallowed`, called where the fit can stop cleanly (between rounds),
    raises it again if it did not stop the fit. Once one has been raised, a second Ctrl-C
    is noted and not raised: the fit is already stopping, and a KeyboardInterrupt raised as
    its unwinding enters a ``threading.Condition`` (cancelling a call, waiting on a
    future) would leave that lock taken for good, and the event loop blocked on it.
    Handlers that do not raise, and threads other than the main one, are left as they are.
    """

    def __init__(self) -> None:
        self.pending = False
        self._handler: Any = None

    def install(self) -> InterruptWatch:
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGINT)
            if callable(handler):
                self._handler = handler
                signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def uninstall(self) -> None:
        if self._handler is not None:
            signal.signal(signal.SIGINT, self._handler)
            self._handler = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.pending:
            return  # already stopping (see the class's notes)
        try:
            self._handler(signum, frame)
        except KeyboardInterrupt:
            self.pending = True
            raise

    def raise_if_swallowed(self) -> None:
        """Raise the KeyboardInterrupt of a Ctrl-C that should have stopped the fit."""
        if self.pending:
            raise KeyboardInterrupt
