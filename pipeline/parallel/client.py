"""What the driver asks of the cluster: its workers, waits that notice a lost worker, scatters.

Used across the Dask layer (staging, re-balancing, scoring, the trainer): the scheduler's
workers asked fresh (:func:`scheduler_workers`), waits that return or raise instead of
hanging on a pinned task whose worker left (:func:`wait_some`, ``_wait_ok``), a direct
scatter to one worker that tells a lost worker from a slow one (:func:`scatter_to`) and a
call to each worker's comm handler straight from the driver, all at once (:func:`call_each`),
and the BLAS limit while the driver's own process holds the workers
(:func:`blas_limit_for_own_workers`).

While a fit runs, its :class:`hmdspt.parallel.membership.Membership` knows who left from
the scheduler's worker events: these waits then ask it and block until a task ends or a
worker they need leaves. Without one (staging outside a fit) they look at the scheduler
between short waits.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from distributed import Client, Future, Worker, wait
from distributed.protocol import to_serialize

__all__ = [
    "Reply",
    "WorkerLostError",
    "blas_limit_for_own_workers",
    "call_each",
    "scatter_to",
    "scheduler_workers",
    "wait_some",
]


def scheduler_workers(client: Client) -> dict[str, dict[str, Any]]:
    """The scheduler's current workers, by address, asked fresh.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which the
    client's own periodic refresh overwrites with an identity that lists no workers.
    When that refresh lands between the fresh fetch and the return, the cluster looks
    empty, and a caller would take every worker for lost.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client; objects without ``sync`` and ``scheduler`` (test doubles)
        fall back to ``scheduler_info()``.

    Returns
    -------
    workers : dict of str to dict
        Worker address to the scheduler's information on it (name, nthreads, memory...).
    """
    if hasattr(client, "sync") and hasattr(client, "scheduler"):
        return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])
    return dict(client.scheduler_info()["workers"])


def _own_workers(client: Client) -> int:
    """How many running Dask workers of ``client``'s scheduler are in this process."""
    scheduler = getattr(getattr(client, "scheduler", None), "address", None)
    if scheduler is None:
        return 0
    # Every Worker object alive in this process: a class attribute distributed keeps (if a
    # later version drops it, nothing is counted and no limit is set).
    workers = list(getattr(Worker, "_instances", ()))
    return sum(
        worker.status.name in ("running", "paused")
        and getattr(worker.scheduler, "address", None) == scheduler
        for worker in workers
    )


@contextmanager
def blas_limit_for_own_workers(client: Client) -> Iterator[int | None]:
    """While the block runs, at most ``cores // workers`` BLAS threads a call when two or
    more workers of ``client``'s cluster run as threads of this process (``processes=False``).

    Distributed starts its worker processes with one BLAS thread (``OMP_NUM_THREADS=1`` and
    the like), but worker threads share the process's BLAS, which starts a thread per core
    in each, so that two workers on two cores run four (docs/design.md, "Heterogeneity on
    one machine"). Workers, not threads: a worker trains one model replica at a time
    whatever its threads. The process's previous limits come back when the block ends; a
    lower limit the user set is kept.

    Parameters
    ----------
    client : distributed.Client
        The fit's client.

    Yields
    ------
    limit : int or None
        The BLAS threads allowed in the block, None when nothing was changed.
    """
    workers = _own_workers(client)
    if workers < 2:
        yield None
        return
    from threadpoolctl import ThreadpoolController

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = max(1, (cores or 1) // workers)
    blas = ThreadpoolController().select(user_api="blas")  # one scan of the loaded libraries
    if max((lib.num_threads for lib in blas.lib_controllers), default=0) <= limit:
        yield None
        return
    with blas.limit(limits=limit):
        yield limit


def _cluster_workers(client: Client) -> list[str]:
    return sorted(scheduler_workers(client))


# Client -> its open hmdspt.parallel.membership.Membership (registered by Membership.start).
_MEMBERSHIPS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _membership(client: Any) -> Any:
    """The open membership of ``client`` (:func:`hmdspt.parallel.membership.active_membership`)."""
    try:
        return _MEMBERSHIPS.get(client)
    except TypeError:  # not weak-referenceable (a test double)
        return None


def _gone_workers(client: Client, addresses: Iterable[str]) -> set[str]:
    """Which of ``addresses`` are not in the cluster (the fit's membership asked, if open)."""
    membership = _membership(client)
    if membership is not None:
        return membership.gone(addresses)
    return set(addresses) - set(scheduler_workers(client))


class WorkerLostError(RuntimeError):
    """A worker left the cluster while staging tasks were waiting for it."""


def wait_some(
    futures: Iterable[Future],
    timeout: float | None,
    return_when: str = "ALL_COMPLETED",
    watch: Iterable[str] = (),
) -> tuple[set[Future], set[Future]]:
    """``distributed.wait`` that returns ``(done, not_done)`` on timeout too.

    distributed's ``wait`` raises :class:`TimeoutError` where ``concurrent.futures``
    returns, and that exception, its traceback and the frames of the client's ``sync``
    call form a reference cycle: until the garbage collector runs, it keeps the callers'
    frames alive, the futures in their locals, and those futures' data on the workers.
    Clearing the caught exception's traceback breaks the cycle.

    ``watch``: worker addresses the tasks are pinned to. While a fit's membership is
    open, the wait also returns as soon as one of them leaves the cluster (a pinned task
    of a lost worker never ends); the caller asks the membership who left.
    """
    futures = list(futures)
    watch = set(watch)
    membership = _membership(futures[0].client) if futures and watch else None
    if membership is not None:
        if return_when == "FIRST_COMPLETED":
            done, _ = membership.wait_any(futures, watch, timeout)
        else:
            try:
                membership.wait_all(futures, watch, timeout)
            except WorkerLostError:
                pass  # the caller asks the membership who left
            done = {f for f in futures if f.done()}
        return done, set(futures) - done
    try:
        done, not_done = wait(futures, timeout=timeout, return_when=return_when)
    except TimeoutError as exc:
        exc.__traceback__ = None
        return set(), set(futures)
    return set(done), set(not_done)


def _wait_ok(futures: Iterable[Future], workers: Iterable[str], poll_s: float = 0.5) -> None:
    """Wait for the futures and re-raise the first worker-side error, without gathering.

    ``workers`` are the addresses the tasks are pinned to (or depend on). A pinned task
    whose worker has left waits forever, so the wait also ends when one of ``workers``
    leaves, including one that left between the caller's plan and this call (a snapshot
    taken here would never see that one go). With a fit's membership open the wait
    blocks until a task ends or a worker leaves; without one it is cut into slices of
    ``poll_s`` and each slice, the first before any waiting, asks the scheduler.

    Raises
    ------
    WorkerLostError
        One of ``workers`` is not (or no longer) in the cluster.
    """
    futures = list(futures)
    needed = set(workers)
    if not futures:
        return
    client = futures[0].client
    membership = _membership(client)
    if membership is not None:
        try:
            membership.wait_all(futures, needed)
        except WorkerLostError:
            gone = ", ".join(sorted(membership.gone(needed)))
            raise WorkerLostError(f"worker {gone} left the cluster during staging") from None
    else:
        pending = futures
        while True:
            gone = needed - set(scheduler_workers(client))
            if gone:
                raise WorkerLostError(
                    f"worker {', '.join(sorted(gone))} left the cluster during staging"
                )
            if not pending:
                break
            try:
                _, pending = wait_some(pending, poll_s)
            except Exception:  # cancelled futures: reported below
                pending = [f for f in pending if f.status == "pending"]
    for fut in futures:
        if fut.status == "error":
            fut.result()  # raises the task's exception; an errored future carries no data
        elif fut.status != "finished":
            raise RuntimeError(f"staging task {fut.key} ended as {fut.status!r}")


def scatter_to(
    client: Client,
    data: Any,
    worker: str,
    timeout: float = 30.0,
    poll_s: float = 0.5,
    key: str | None = None,
) -> Future:
    """Scatter ``data`` straight to ``worker`` (no hashing); a future pinned there.

    ``key`` names the data's key (default: one that Dask makes up).

    distributed's direct scatter waits, for as long as its timeout, until the worker
    *runs*; one that is retiring or has left never will. Here each attempt waits
    ``poll_s`` for that and then checks that the worker is still in the cluster. Once the
    worker runs, the attempt connects to it, and distributed retries a refused connection
    for its whole connect timeout (30 s): an attempt is therefore waited on only while its
    worker stays in the cluster, and abandoned as soon as it leaves. A broken connection
    (the worker died mid-transfer, before the scheduler noticed) is one more failed
    attempt: the next look at the cluster tells a lost worker from a blip.

    Raises
    ------
    WorkerLostError
        ``worker`` left the cluster (or was never in it).
    TimeoutError
        ``worker`` stayed in the cluster for ``timeout`` seconds without taking the data
        (paused for memory, retiring without leaving, or unreachable).
    """
    deadline = time.monotonic() + timeout
    payload = data if key is None else {key: data}
    while True:
        broken: OSError | None = None
        attempt = _start_on_loop(
            client,
            client.scatter(
                payload, workers=[worker], direct=True, hash=False, timeout=poll_s,
                asynchronous=True,
            ),
        )  # fmt: skip
        if not _ended_while_present(client, attempt, worker, poll_s):
            raise WorkerLostError(f"worker {worker} left the cluster during staging")
        try:
            result = attempt.result()
            return result if key is None else result[key]
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            exc.__traceback__ = None  # see wait_some: the cycle would keep data alive
        except OSError as exc:  # CommClosedError, connection refused or reset
            exc.__traceback__ = None
            broken = exc
        membership = _membership(client)
        if membership is not None and membership.gone({worker}):
            raise WorkerLostError(f"worker {worker} left the cluster during staging")
        info = scheduler_workers(client).get(worker) if membership is None else {}
        if info is None:
            raise WorkerLostError(f"worker {worker} left the cluster during staging")
        if time.monotonic() >= deadline:
            info = scheduler_workers(client).get(worker, {})  # for its status
            raise TimeoutError(
                f"worker {worker} took no data for {timeout:g} s: it is in the cluster but "
                f"not running tasks (status {info.get('status', 'unknown')!r}"
                + (f", last error {broken!r})" if broken is not None else ")")
            )
        if broken is not None:  # failed at once: give the scheduler time to notice
            pause = min(poll_s, max(deadline - time.monotonic(), 0.0))
            if membership is not None:
                membership.wait_gone({worker}, pause)  # ends early when it leaves
            else:
                time.sleep(pause)


def _start_on_loop(client: Client, call: Coroutine[Any, Any, Any]) -> Reply:
    """Run the coroutine ``call`` on the client's event loop; its cancellable reply."""
    loop = client.loop.asyncio_loop
    reply = Reply(loop)
    loop.call_soon_threadsafe(reply._start, call)
    return reply


def _ended_while_present(client: Client, reply: Reply, worker: str, poll_s: float) -> bool:
    """Wait for ``reply`` while ``worker`` stays in the cluster: whether it ended.

    When the worker leaves first, False is returned and the call is left to end on the
    loop, its outcome unread: cancelling it would orphan the task distributed's scatter
    runs the transfer in, whose error asyncio then logs ("Task exception was never
    retrieved") once the connection pool gives up. The fit's membership wakes the wait
    as the worker leaves; without one, the scheduler is asked every ``poll_s`` seconds.
    """
    membership = _membership(client)
    if membership is None:
        # A queue, not a threading.Event: see Wakeups (a Ctrl-C inside Event.wait can
        # leave its lock taken, and the event loop's set() would then block for good).
        ended: queue.SimpleQueue = queue.SimpleQueue()
        reply.add_done_callback(lambda _: ended.put(None))
    while not reply.done():
        if membership is not None:
            _, gone = membership.wait_any([reply], {worker})
        else:
            try:
                ended.get(timeout=poll_s)
                gone = False
            except queue.Empty:
                gone = worker not in scheduler_workers(client)
        if gone and not reply.done():
            return False
    return True


class Reply:
    """The outcome of a call run on the client's event loop (:func:`_start_on_loop`): one
    worker's answer to :func:`call_each`, or one attempt of :func:`scatter_to`. Set on the
    event loop, read anywhere.

    Not a ``concurrent.futures.Future``: that one's methods take a ``threading.Condition``,
    and a Ctrl-C landing in the driver as one of them enters it leaves its lock taken for
    good; the event loop's ``set_result`` then blocks forever, and with it the cluster's
    close. A reply is read without a lock and its callbacks are kept under a plain one.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._outcome: tuple[bool, Any] | None = None  # (succeeded, result or error)
        self._callbacks: list[Callable[[Reply], Any]] = []
        self._task: asyncio.Task | None = None

    def done(self) -> bool:
        """Whether the call has answered, failed or been cancelled."""
        return self._outcome is not None

    def result(self) -> Any:
        """The handler's ``result``; raises the call's error. Call only when done."""
        if self._outcome is None:
            raise RuntimeError("the call has not answered yet")
        succeeded, value = self._outcome
        if not succeeded:
            raise value
        return value

    def add_done_callback(self, fn: Callable[[Reply], Any]) -> None:
        """Call ``fn(reply)`` when done (at once if it is), on the thread that ends it."""
        with self._lock:
            if self._outcome is None:
                self._callbacks.append(fn)
                return
        fn(self)

    def cancel(self) -> None:
        """Stop waiting for the answer: the reply is done, its call cancelled on the loop."""
        if self._set((False, asyncio.CancelledError())):
            try:
                self._loop.call_soon_threadsafe(self._cancel_task)
            except RuntimeError:  # the loop has closed: nothing runs on it any more
                pass

    def _cancel_task(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _set(self, outcome: tuple[bool, Any]) -> bool:
        with self._lock:
            if self._outcome is not None:
                return False
            self._outcome, callbacks, self._callbacks = outcome, self._callbacks, []
        for fn in callbacks:
            fn(self)
        return True

    def _start(self, call: Coroutine[Any, Any, Any]) -> None:
        """On the loop: run the call, end the reply with its outcome."""

        async def run() -> None:
            try:
                value = await call
            except BaseException as exc:  # the call's error is the reply's (cancel too)
                self._set((False, exc))
                if not isinstance(exc, Exception):
                    raise
            else:
                self._set((True, value))

        if self._outcome is None:
            self._task = asyncio.ensure_future(run())
        else:
            call.close()  # cancelled before it started


def call_each(client: Client, op: str, calls: Mapping[str, Mapping[str, Any]]) -> dict[str, Reply]:
    """Call the comm handler ``op`` of each worker straight from the driver, all at once.

    Each call goes over the client's connection pool to its worker, not through the
    scheduler; its arguments are pickled (``to_serialize``), and so is the handler's
    ``result`` (it replies ``{"status": "OK", "result": to_serialize(...)}``).

    Parameters
    ----------
    client : distributed.Client
    op : str
        The handler's name in the workers' ``handlers``.
    calls : mapping of worker address to a mapping of argument name to value

    Returns
    -------
    dict
        A :class:`Reply` per worker of its handler's ``result``. A call to a worker that
        dies fails with the broken connection's error; one to a worker that hangs does
        not end, so wait on it with the fit's membership
        (:meth:`hmdspt.parallel.membership.Membership.wait_any`) and cancel it when the
        worker has left.
    """

    async def call(address: str, kwargs: Mapping[str, Any]) -> Any:
        rpc = client.rpc(address)
        reply = await getattr(rpc, op)(**{k: to_serialize(v) for k, v in kwargs.items()})
        return reply["result"]

    return {address: _start_on_loop(client, call(address, kw)) for address, kw in calls.items()}
