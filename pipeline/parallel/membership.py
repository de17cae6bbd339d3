"""One live view of the cluster's workers, fed by the scheduler's own worker events.

The scheduler logs every worker it adds or removes on its event topic ``"all"``
(``Scheduler.add_worker`` / ``remove_worker``). :class:`Membership` subscribes its client to
that topic and keeps the set of live workers from those events: no polling, and a wait
that must notice a lost worker (:meth:`Membership.wait_gone`, :meth:`Membership.wait_any`)
blocks until the event handler, or a future's completion, wakes it (:class:`Wakeups`).

While a membership is open, :func:`active_membership` returns it for its client, so the
waits of :mod:`hmdspt.parallel.client` (and through them staging and re-balancing) ask it
instead of the scheduler.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Client, Future

from hmdspt.parallel.client import _MEMBERSHIPS, WorkerLostError, _membership, scheduler_workers

__all__ = ["Membership", "Wakeups", "active_membership"]

TOPIC = "all"


def active_membership(client: Any) -> Membership | None:
    """The open :class:`Membership` of ``client``, or None."""
    return _membership(client)


def _subscribe_and_snapshot(dask_scheduler: Any, client_id: str) -> dict[str, Any]:
    """On the scheduler, in one step of its event loop: subscribe, list the workers."""
    topic = dask_scheduler._broker._topics[TOPIC]
    topic.subscribe(client_id)
    return {"workers": list(dask_scheduler.workers), "count": topic.count}


def _unsubscribe(dask_scheduler: Any, client_id: str) -> int:
    """On the scheduler: unsubscribe; how many events the topic has had."""
    topic = dask_scheduler._broker._topics[TOPIC]
    topic.unsubscribe(client_id)
    return topic.count


class Wakeups:
    """A lock for shared state and waits on it that other threads wake, safe from Ctrl-C.

    ``threading.Condition`` is not: its ``with`` runs Python code between taking its lock
    and entering the block, and a KeyboardInterrupt raised there leaves the lock taken for
    good; the event loop's next notify then blocks forever, and with it the cluster's
    close. Here ``with wakeups.lock`` takes a plain lock in one step, and a wait blocks on
    a queue of its own that :meth:`notify_all` puts into (both in C).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._waiting: set[queue.SimpleQueue] = set()

    def notify_all(self) -> None:
        """Wake every wait (any thread; never blocks on a waiting thread)."""
        with self.lock:
            waiting = list(self._waiting)
        for wake in waiting:
            wake.put(None)

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Block until ``predicate()``, called with :attr:`lock` held, is true, or until
        ``timeout`` seconds; its last value."""
        wake: queue.SimpleQueue = queue.SimpleQueue()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self._waiting.add(wake)
        try:
            while True:
                with self.lock:
                    result = predicate()
                left = None if deadline is None else deadline - time.monotonic()
                if result or (left is not None and left <= 0):
                    return result
                try:
                    wake.get(timeout=left)
                except queue.Empty:
                    pass
        finally:
            with self.lock:
                self._waiting.discard(wake)


class _Feed:
    """A client's one subscription to the worker events, shared by its open memberships.

    Fits that run at once on one client (scikit-learn's search with joblib's threading
    backend) each open a membership; the scheduler keeps one subscription per client and
    topic, and the client one handler per topic. So the first membership subscribes, the
    last one to close unsubscribes, and the live workers are kept here, once for all.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.changed = Wakeups()
        self.live: set[str] = set()
        self.departed: set[str] = set()  # seen live, then removed (and not back)
        self.joins: list[str] = []  # every add event, in order
        self.received = 0  # events of the topic received since the subscription
        self.first_count = 0
        self.previous: Any = None  # the client's own "all" handler, if it had one
        self.atomic = False
        self.members: list[Membership] = []  # open, oldest first

    def open(self) -> None:
        handlers = getattr(self.client, "_event_handlers", {})
        self.previous = handlers.get(TOPIC)
        handlers[TOPIC] = self.handle
        try:
            snapshot = self.client.run_on_scheduler(
                _subscribe_and_snapshot, client_id=self.client.id
            )
            self.atomic = True
        except Exception:  # the scheduler runs no client functions: subscribe plainly
            self.atomic = False
            self.client.subscribe_topic(TOPIC, self.handle)
            snapshot = {"workers": list(scheduler_workers(self.client)), "count": 0}
        with self.changed.lock:
            # Events that arrived during the snapshot happened after it (atomic case).
            self.live |= set(snapshot["workers"]) - self.departed
            self.first_count = int(snapshot["count"])
        self.changed.notify_all()

    def close(self, timeout: float) -> None:
        handlers = getattr(self.client, "_event_handlers", {})
        try:
            if self.client.status != "running":
                # Its calls would wait out its reconnect (30 s by default) before failing;
                # a scheduler it lost sends no more events, nor one it is closed to.
                pass
            elif self.atomic:
                count = self.client.run_on_scheduler(_unsubscribe, client_id=self.client.id)
                # Events already on their way: let them land on this handler.
                expected = int(count) - self.first_count
                self.changed.wait_for(lambda: self.received >= expected, timeout)
            else:
                self.client.unsubscribe_topic(TOPIC)
        except Exception:  # the scheduler is gone: no more events will come
            pass
        finally:
            if handlers.get(TOPIC) == self.handle:
                if self.previous is not None:
                    self.client.subscribe_topic(TOPIC, self.previous)
                else:
                    handlers.pop(TOPIC, None)
            self.changed.notify_all()

    def handle(self, event: tuple[float, Any]) -> None:
        """The client's handler of topic ``"all"`` (runs on the client's event loop)."""
        _, msg = event
        action = msg.get("action") if isinstance(msg, dict) else None
        with self.changed.lock:
            self.received += 1
            if action == "add-worker":
                self.live.add(msg["worker"])
                self.departed.discard(msg["worker"])
                self.joins.append(msg["worker"])
            elif action == "remove-worker":
                self.live.discard(msg["worker"])
                self.departed.add(msg["worker"])
        self.changed.notify_all()
        if self.previous is not None:
            self.previous(event)


#: The open feed of each client; the lock orders memberships opening and closing on it.
_FEEDS: weakref.WeakKeyDictionary[Client, _Feed] = weakref.WeakKeyDictionary()
_FEEDS_LOCK = threading.Lock()


class Membership:
    """The cluster's live workers, kept from the scheduler's worker events.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client. Its event handler of topic ``"all"`` is taken while a
        membership is open on it and given back when the last one closes (a handler set
        before is still called with every event meanwhile).

    Notes
    -----
    Subscribing and listing the workers happen in one step on the scheduler, so no worker
    added or removed in between is missed; the number of events the topic had at that
    step, and at the unsubscribe, tells :meth:`close` when the last event sent to this
    client has arrived, so none reaches the client after its handler is gone. A scheduler
    that runs no functions from clients (``distributed.scheduler.pickle`` off) gets the
    plain subscription and a separate listing of the workers. Memberships open at once on
    one client (concurrent fits) share that subscription (``_Feed``): one fit's end does
    not stop the others' events.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        # Until started, a feed of its own that nothing feeds (no workers); after close,
        # the shared one, no longer updated for this membership's reads.
        self._feed = _Feed(client)
        self._open = False
        self._first_join = 0  # the feed's joins before this membership opened

    @property
    def _changed(self) -> Wakeups:
        return self._feed.changed

    # ---------------------------------------------------------------- lifetime
    def start(self) -> Membership:
        """Subscribe to the worker events and take the current workers; returns self."""
        if self._open:
            return self
        with _FEEDS_LOCK:
            feed = _FEEDS.get(self.client)
            if feed is None:
                feed = _Feed(self.client)
                feed.open()
                _FEEDS[self.client] = feed
            with feed.changed.lock:
                self._first_join = len(feed.joins)
            feed.members.append(self)
            self._feed, self._open = feed, True
            _MEMBERSHIPS[self.client] = self
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Leave the feed; the last membership unsubscribes and gives the client its own
        handler back (never raises)."""
        if not self._open:
            return
        feed = self._feed
        with _FEEDS_LOCK:
            feed.members.remove(self)
            if _MEMBERSHIPS.get(self.client) is self:
                if feed.members:  # the waits of the fits still running ask another
                    _MEMBERSHIPS[self.client] = feed.members[-1]
                else:
                    del _MEMBERSHIPS[self.client]
            if not feed.members:
                if _FEEDS.get(self.client) is feed:
                    del _FEEDS[self.client]
                feed.close(timeout)
            self._open = False

    def __enter__(self) -> Membership:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ views
    def live(self) -> set[str]:
        """The addresses of the workers in the cluster now."""
        feed = self._feed
        with feed.changed.lock:
            return set(feed.live)

    def joined(self, known: Iterable[str]) -> set[str]:
        """Live workers not among ``known`` (those that joined since ``known`` was taken)."""
        return self.live() - set(known)

    def joins(self) -> list[str]:
        """Every worker address the scheduler added since the subscription, in order."""
        feed = self._feed
        with feed.changed.lock:
            return list(feed.joins[self._first_join :])

    def wait_joined(self, known: Iterable[str], timeout: float) -> set[str]:
        """Block until a worker not among ``known`` is live, or ``timeout``; those joined."""
        known = set(known)
        feed = self._feed
        return feed.changed.wait_for(lambda: feed.live - known, timeout)

    def gone(self, addresses: Iterable[str]) -> set[str]:
        """Which of ``addresses`` are not in the cluster."""
        addresses = set(addresses)
        feed = self._feed
        with feed.changed.lock:
            missing = addresses - feed.live
            unseen = missing - feed.departed
        if unseen:
            # Never seen here: maybe its add event is still on its way; ask once.
            missing -= unseen & set(scheduler_workers(self.client))
        return missing

    def _gone_locked(self, addresses: set[str]) -> set[str]:
        return addresses & self._feed.departed

    # ------------------------------------------------------------------ waits
    def wait_gone(self, addresses: Iterable[str], timeout: float) -> set[str]:
        """Block until one of ``addresses`` leaves, or ``timeout`` seconds; those gone."""
        addresses = set(addresses)
        gone = self.gone(addresses)
        if gone or timeout <= 0:
            return gone
        self._changed.wait_for(lambda: self._gone_locked(addresses), timeout)
        return self.gone(addresses)

    def wait_any(
        self, futures: Iterable[Future], watch: Iterable[str], timeout: float | None = None
    ) -> tuple[set[Future], set[str]]:
        """Block until a future is done or a worker of ``watch`` leaves (or ``timeout``).

        Returns
        -------
        done : set of Future
            The futures done (finished, erred or cancelled).
        gone : set of str
            The addresses of ``watch`` no longer in the cluster.
        """
        futures, watch = list(futures), set(watch)
        gone = self.gone(watch)
        done = {f for f in futures if f.done()}
        if done or gone or not futures:
            return done, gone
        for future in futures:
            future.add_done_callback(self._poke)
        self._changed.wait_for(
            lambda: self._gone_locked(watch) or any(f.done() for f in futures), timeout
        )
        return {f for f in futures if f.done()}, self.gone(watch)

    def wait_all(
        self, futures: Iterable[Future], watch: Iterable[str], timeout: float | None = None
    ) -> set[Future]:
        """Block until every future is done; the ones not done at ``timeout``.

        Raises
        ------
        WorkerLostError
            A worker of ``watch`` left first (or had already left).
        """
        pending = set(futures)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done, gone = self.wait_any(
                pending, watch, None if deadline is None else max(deadline - time.monotonic(), 0)
            )
            if gone:
                raise WorkerLostError(f"worker {', '.join(sorted(gone))} left the cluster")
            pending -= done
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                return pending

    def _poke(self, _future: Future) -> None:
        self._changed.notify_all()
