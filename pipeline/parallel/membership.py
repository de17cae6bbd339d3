"""One live view of the cluster's workers, fed by the scheduler's own worker events.

The scheduler logs every worker it adds or removes on its event topic ``"all"``
(``Scheduler.add_worker`` / ``remove_worker``). :class:`Membership` subscribes its client to
that topic and keeps the set of live workers from those events: no polling, and a wait
that must notice a lost worker (:meth:`Membership.wait_gone`, :meth:`Membership.wait_any`)
blocks on a condition that the event handler, or a future's completion, wakes.

While a membership is open, :func:`active_membership` returns it for its client, so the
waits of :mod:`hmdspt.parallel.client` (and through them staging and re-balancing) ask it
instead of the scheduler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from distributed import Client, Future

from hmdspt.parallel.client import _MEMBERSHIPS, WorkerLostError, _membership, scheduler_workers

__all__ = ["Membership", "active_membership"]

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


class Membership:
    """The cluster's live workers, kept from the scheduler's worker events.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client. Its event handler of topic ``"all"`` is taken while the
        membership is open and given back by :meth:`close` (a handler set before is
        still called with every event meanwhile).

    Notes
    -----
    Subscribing and listing the workers happen in one step on the scheduler, so no worker
    added or removed in between is missed; the number of events the topic had at that
    step, and at the unsubscribe, tells :meth:`close` when the last event sent to this
    client has arrived, so none reaches the client after its handler is gone. A scheduler
    that runs no functions from clients (``distributed.scheduler.pickle`` off) gets the
    plain subscription and a separate listing of the workers.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._changed = threading.Condition()
        self._live: set[str] = set()
        self._departed: set[str] = set()  # seen live, then removed (and not back)
        self._joins: list[str] = []  # every add event, in order
        self._received = 0  # events of the topic received since the subscription
        self._expected: int | None = None  # at close: events the scheduler sent us
        self._first_count = 0
        self._previous: Any = None  # the client's own "all" handler, if it had one
        self._open = False
        self._atomic = False

    # ---------------------------------------------------------------- lifetime
    def start(self) -> Membership:
        """Subscribe to the worker events and take the current workers; returns self."""
        if self._open:
            return self
        handlers = getattr(self.client, "_event_handlers", {})
        self._previous = handlers.get(TOPIC)
        self._open = True
        try:
            handlers[TOPIC] = self._handle
            snapshot = self.client.run_on_scheduler(
                _subscribe_and_snapshot, client_id=self.client.id
            )
            self._atomic = True
        except Exception:  # the scheduler runs no client functions: subscribe plainly
            self._atomic = False
            self.client.subscribe_topic(TOPIC, self._handle)
            snapshot = {"workers": list(scheduler_workers(self.client)), "count": 0}
        with self._changed:
            # Events that arrived during the snapshot happened after it (atomic case).
            self._live |= set(snapshot["workers"]) - self._departed
            self._first_count = int(snapshot["count"])
            self._changed.notify_all()
        _MEMBERSHIPS[self.client] = self
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Unsubscribe and give the client its own handler back (never raises)."""
        if not self._open:
            return
        self._open = False
        if _MEMBERSHIPS.get(self.client) is self:
            del _MEMBERSHIPS[self.client]
        handlers = getattr(self.client, "_event_handlers", {})
        try:
            if self._atomic:
                count = self.client.run_on_scheduler(_unsubscribe, client_id=self.client.id)
                with self._changed:
                    # Events already on their way: let them land on this handler.
                    self._expected = int(count) - self._first_count
                    self._changed.wait_for(lambda: self._received >= self._expected, timeout)
            else:
                self.client.unsubscribe_topic(TOPIC)
        except Exception:  # the scheduler is gone: no more events will come
            pass
        finally:
            if handlers.get(TOPIC) == self._handle:
                if self._previous is not None:
                    self.client.subscribe_topic(TOPIC, self._previous)
                else:
                    handlers.pop(TOPIC, None)
            with self._changed:
                self._changed.notify_all()

    def __enter__(self) -> Membership:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _handle(self, event: tuple[float, Any]) -> None:
        """The client's handler of topic ``"all"`` (runs on the client's event loop)."""
        _, msg = event
        action = msg.get("action") if isinstance(msg, dict) else None
        with self._changed:
            self._received += 1
            if action == "add-worker":
                self._live.add(msg["worker"])
                self._departed.discard(msg["worker"])
                self._joins.append(msg["worker"])
            elif action == "remove-worker":
                self._live.discard(msg["worker"])
                self._departed.add(msg["worker"])
            self._changed.notify_all()
        if self._previous is not None:
            self._previous(event)

    # ------------------------------------------------------------------ views
    def live(self) -> set[str]:
        """The addresses of the workers in the cluster now."""
        with self._changed:
            return set(self._live)

    def joined(self, known: Iterable[str]) -> set[str]:
        """Live workers not among ``known`` (those that joined since ``known`` was taken)."""
        return self.live() - set(known)

    def joins(self) -> list[str]:
        """Every worker address the scheduler added since the subscription, in order."""
        with self._changed:
            return list(self._joins)

    def wait_joined(self, known: Iterable[str], timeout: float) -> set[str]:
        """Block until a worker not among ``known`` is live, or ``timeout``; those joined."""
        known = set(known)
        with self._changed:
            self._changed.wait_for(lambda: self._live - known, timeout)
            return self._live - known

    def gone(self, addresses: Iterable[str]) -> set[str]:
        """Which of ``addresses`` are not in the cluster."""
        addresses = set(addresses)
        with self._changed:
            missing = addresses - self._live
            unseen = missing - self._departed
        if unseen:
            # Never seen here: maybe its add event is still on its way; ask once.
            missing -= unseen & set(scheduler_workers(self.client))
        return missing

    def _gone_locked(self, addresses: set[str]) -> set[str]:
        return addresses & self._departed

    # ------------------------------------------------------------------ waits
    def wait_gone(self, addresses: Iterable[str], timeout: float) -> set[str]:
        """Block until one of ``addresses`` leaves, or ``timeout`` seconds; those gone."""
        addresses = set(addresses)
        gone = self.gone(addresses)
        if gone or timeout <= 0:
            return gone
        with self._changed:
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
        with self._changed:
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
        with self._changed:
            self._changed.notify_all()
