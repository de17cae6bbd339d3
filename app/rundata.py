"""What the monitor knows about a run: aggregates of its run log, updated incrementally.

No Panel or Bokeh here, so the aggregation is tested and benchmarked on its own. Everything
comes from the run log (``hmdspt.core.runlog``): the monitor never talks to the cluster and
never unpickles anything.

- :func:`list_runs` lists the logs of a folder and its subfolders, newest first.
- :class:`RunData` follows one run of a log through :class:`hmdspt.core.runlog.RunLogTail`,
  so each :meth:`RunData.poll` costs what was appended, not the size of the log, and keeps
  compact numpy arrays (rounds x workers) instead of the events.
- :func:`compare_runs` puts two runs side by side (fastest worker's idle fraction, time to
  a target validation score, final score).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hmdspt.core.runlog import (
    RunLogTail,
    RunTotals,
    event_problem,
    finite,
    fit_wall_time,
    parse_event,
    read_events,
    summarize,
)

__all__ = [
    "RunData",
    "RunInfo",
    "Update",
    "compare_runs",
    "emulation_label",
    "list_runs",
    "peek_run",
]

MARKER_KINDS = ("re-balance", "worker lost", "worker joined", "checkpoint")


def _num(x: Any) -> float:
    """The run log's number (:func:`hmdspt.core.runlog.finite`) as a float for the charts:
    NaN where the run log has none."""
    x = finite(x)
    return math.nan if x is None else x


# --------------------------------------------------------------------------------------
# Listing runs
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One log file as the run picker shows it (from its first line only)."""

    path: Path
    mtime: float
    size: int
    run_id: str | None
    config: Mapping[str, Any]
    n_workers: int | None
    name: str = ""  # the path within the listed folder, e.g. "compare/hmdspt.jsonl"

    @property
    def label(self) -> str:
        """Short text for a picker: name in the folder, strategy and worker count when known."""
        bits = [self.name or self.path.name]
        details = []
        if self.config.get("partition"):
            details.append(f"partition={self.config['partition']}")
        if self.config.get("sync"):  # the baselines "local" and "bsp" differ only here
            details.append(f"sync={self.config['sync']}")
        if self.n_workers is not None:
            details.append(f"{self.n_workers} workers")
        if self.size == 0:
            details.append("empty")
        if details:
            bits.append(f"({', '.join(details)})")
        return " ".join(bits)


def peek_run(path: str | os.PathLike, max_bytes: int = 65536) -> RunInfo:
    """Describe a log from its first complete line (``run_start`` when the log has one).

    Reads at most ``max_bytes``, so listing a folder of long logs stays cheap.
    """
    path = Path(path)
    st = path.stat()
    run_id, config, n_workers = None, {}, None
    with open(path, "rb") as f:
        head = f.read(max_bytes)
    end = head.find(b"\n")
    if end > 0:
        try:
            first = parse_event(head[:end])
        except ValueError:  # malformed: the run's page says so, the picker shows the name
            first = None
        if isinstance(first, dict):
            run_id = first.get("run_id") if isinstance(first.get("run_id"), str) else None
            if first.get("event") == "run_start":
                config = first.get("config") if isinstance(first.get("config"), dict) else {}
                workers = first.get("workers")
                n_workers = len(workers) if isinstance(workers, list) else None
    return RunInfo(path, st.st_mtime, st.st_size, run_id, config, n_workers)


def _logs_under(folder: Path) -> Iterable[Path]:
    """The ``*.jsonl`` files of ``folder`` and its subfolders (``runs/compare/``).

    Hidden folders are skipped, and folder links not followed (no cycles).
    """
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for file in files:
            if file.endswith(".jsonl"):
                yield Path(root, file)


def list_runs(path: str | os.PathLike) -> list[RunInfo]:
    """The run logs at ``path``: the file itself, or the ``*.jsonl`` of a folder and of its
    subfolders (``hmdspt compare`` writes to ``runs/compare/``), newest first.

    Parameters
    ----------
    path : str or path-like
        A log file or a folder of logs.

    Returns
    -------
    runs : list of RunInfo
        Newest first by modification time (a running log is the newest), then by name,
        which sorts by start time for ``<run_id>.jsonl`` files. Each one's ``name`` is its
        path within the folder, so logs of the same name in two subfolders differ.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return [peek_run(path)]
    if not path.is_dir():
        raise FileNotFoundError(f"no run log or folder at {path}")
    runs = []
    for p in _logs_under(path):
        try:
            info = peek_run(p)
        except OSError:  # removed between listing and stat, or unreadable: not a run to show
            continue
        runs.append(dataclasses.replace(info, name=p.relative_to(path).as_posix()))
    runs.sort(key=lambda r: (r.mtime, r.name), reverse=True)
    return runs


def _ratio(speeds: Any) -> str | None:
    """``"4:2:1"`` from a list of numbers or a mapping of worker name to number."""
    if isinstance(speeds, Mapping):
        speeds = list(speeds.values())
    if (
        isinstance(speeds, (list, tuple))
        and speeds
        and all(math.isfinite(_num(v)) and _num(v) > 0 for v in speeds)
    ):
        return ":".join(f"{_num(v):g}" for v in speeds)
    return None


def emulation_label(config: Mapping[str, Any] | None) -> str | None:
    """The header's note when heterogeneity was emulated on one machine, else None.

    The trainer on the local emulated cluster writes ``config.emulation`` as
    ``{"speeds": [...], "method": "..."}`` (as does the synthetic fixture; older logs:
    ``emulated_speeds``). Any top-level key starting with ``emulat`` whose value is not
    null, false or empty counts. Speeds are shown as a ratio when they are numbers (a
    list, or a mapping of worker name to speed), and the method when there is one.
    """
    if not isinstance(config, Mapping):
        return None
    for key, value in config.items():
        if not str(key).lower().startswith("emulat") or value in (None, False, 0, "", [], {}):
            continue
        details = []
        if isinstance(value, Mapping):
            ratio = _ratio(value.get("speeds"))
            if ratio:
                details.append(f"speeds {ratio}")
            if isinstance(value.get("method"), str) and value["method"]:
                details.append(value["method"])
            if not details:  # an unknown shape: show what it holds, briefly
                details.append(", ".join(f"{k}={v}" for k, v in list(value.items())[:6]))
        else:
            ratio = _ratio(value)
            if ratio:
                details.append(f"speeds {ratio}")
        detail = f" ({'; '.join(details)})" if details else ""
        return "heterogeneity emulated on one machine" + detail
    return None


# --------------------------------------------------------------------------------------
# Growable arrays
# --------------------------------------------------------------------------------------


class _Rows:
    """A float matrix that grows by rows and columns (capacity doubling), NaN-filled."""

    def __init__(self, n_cols: int = 0) -> None:
        self._a = np.full((16, max(n_cols, 4)), np.nan)
        self.n = 0
        self.cols = n_cols

    def add_cols(self, n_cols: int) -> None:
        if n_cols > self._a.shape[1]:
            grown = np.full((self._a.shape[0], max(n_cols, 2 * self._a.shape[1])), np.nan)
            grown[:, : self._a.shape[1]] = self._a
            self._a = grown
        self.cols = max(self.cols, n_cols)

    def append(self, row: np.ndarray | None = None) -> np.ndarray:
        """Append a row (a copy of ``row`` or NaNs); return a writable view of it."""
        if self.n == self._a.shape[0]:
            grown = np.full((2 * self._a.shape[0], self._a.shape[1]), np.nan)
            grown[: self.n] = self._a[: self.n]
            self._a = grown
        if row is not None:
            self._a[self.n, : len(row)] = row
        self.n += 1
        return self._a[self.n - 1, : self.cols]

    @property
    def values(self) -> np.ndarray:
        return self._a[: self.n, : self.cols]


class _Vec(_Rows):
    """A growable float vector."""

    def __init__(self) -> None:
        super().__init__(1)

    def push(self, x: float) -> None:
        self.append()[0] = x

    @property
    def values(self) -> np.ndarray:
        return self._a[: self.n, 0]


# --------------------------------------------------------------------------------------
# One run, followed incrementally
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Update:
    """What one :meth:`RunData.poll` changed, so the views touch only that."""

    events: int = 0
    reset: bool = False
    meta: bool = False
    rounds_from: int | None = None  # index of the first new round, if any
    partitions: bool = False
    scores: bool = False
    markers_from: int | None = None
    bytes_read: int = 0

    @property
    def changed(self) -> bool:
        return self.events > 0 or self.reset


class RunData:
    """The monitor's aggregates of one run, fed by a byte-offset tail of its log.

    Parameters
    ----------
    path : str or path-like
        The run log.
    run_id : str, optional
        Run to show when the file holds several. By default the last one: when a new
        ``run_start`` with another id appears the state starts over with that run.

    Attributes
    ----------
    tail : hmdspt.core.runlog.RunLogTail
    run_id : str or None
    run_ids : list of str
        Runs seen in the file, in order.
    start, end : dict or None
        The ``run_start`` and ``run_end`` events.
    t0 : float or None
        Unix time the run's times are measured from (``run_start``, else its first event).
    latest : float or None
        Unix time of the run's latest event (a running fit's wall time counts up to it).
    workers : list of str
        Worker names, in order of first appearance (``run_start`` first).
    markers : list of dict
        Re-balances, workers lost and joined, checkpoints: ``t`` (s since ``t0``),
        ``round``, ``kind`` (one of :data:`MARKER_KINDS`) and ``label``.
    """

    def __init__(self, path: str | os.PathLike, run_id: str | None = None) -> None:
        self.path = Path(path)
        self.tail = RunLogTail(self.path)
        self.fixed_run_id = run_id
        self.run_ids: list[str] = []
        self._clear(run_id)

    def _clear(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.start: dict | None = None
        self.end: dict | None = None
        self.t0: float | None = None
        self.latest: float | None = None
        self.n_events = 0
        self.workers: list[str] = []
        self._widx: dict[str, int] = {}
        # Per round.
        self.round_no = _Vec()
        self.round_t = _Vec()  # end of the round, seconds since t0
        self.wall = _Vec()
        self.loss = _Vec()
        self.val = _Vec()
        self.busy = _Rows()
        self.comm = _Rows()
        self.idle = _Rows()
        self.rows = _Rows()
        # Per partition event: rows per worker.
        self.part_round = _Vec()
        self.part_t = _Vec()
        self.part_rows = _Rows()
        # Scores, carried forward: one row per round that has score events.
        self.score_round = _Vec()
        self.score_t = _Vec()
        self.scores = _Rows()
        self.markers: list[dict] = []
        self._lost: set[int] = set()
        self._totals = RunTotals()

    # -- properties -------------------------------------------------------------------

    @property
    def n_rounds(self) -> int:
        return self.round_no.n

    @property
    def config(self) -> Mapping[str, Any]:
        cfg = (self.start or {}).get("config")
        return cfg if isinstance(cfg, Mapping) else {}

    @property
    def status(self) -> str:
        """``"running"`` until ``run_end``, then its status."""
        if self.end is None:
            return "running"
        return str(self.end.get("status") or "ended")

    def silent_for(self, now: float) -> float | None:
        """Seconds at ``now`` (Unix time) since a running fit's last sign of life.

        The later of its latest event and the log's modification time; None once the run
        has ended or before it has written an event. A driver that was killed, or whose
        machine was lost, never writes ``run_end``: its run stays "running" for good.
        """
        if self.end is not None or self.latest is None:
            return None
        try:
            last = max(self.latest, self.path.stat().st_mtime)
        except OSError:  # removed or unreadable: the event times are all there is
            last = self.latest
        return max(0.0, now - last)

    @property
    def skipped_lines(self) -> int:
        """Complete lines of the log skipped as malformed: not JSON, too long or too deep,
        or events of the wrong shape (:func:`hmdspt.core.runlog.parse_event`)."""
        return self.tail.skipped

    @property
    def torn_bytes(self) -> int:
        """Bytes of an unfinished last line (being written, or cut by a crash)."""
        return self.tail.pending_bytes

    # -- reading ----------------------------------------------------------------------

    def poll(self) -> Update:
        """Read what was appended to the log since the last call and aggregate it."""
        before, restarts = self.tail.offset, self.tail.restarts
        events = self.tail.read_new()
        upd = Update(bytes_read=self.tail.offset - before)
        # Replaced or truncated: the events are the file's from its first line again. A
        # larger replacement (rsync, scp) moves the offset forward, so ask the tail.
        if self.tail.restarts != restarts:
            self.run_ids = []
            self._clear(self.fixed_run_id)
            upd.reset = True
            upd.bytes_read = self.tail.offset
        self.ingest(events, upd)
        return upd

    def ingest(self, events: Iterable[Mapping[str, Any]], upd: Update | None = None) -> Update:
        """Aggregate events (in log order); :meth:`poll` calls it with the tail's events.

        The events must have passed :func:`hmdspt.core.runlog.event_problem`, as those of
        :func:`hmdspt.core.runlog.read_events` and the tail have.
        """
        upd = Update() if upd is None else upd
        rounds_batch: list[Mapping[str, Any]] = []
        for e in events:
            rid = e.get("run_id")
            if isinstance(rid, str) and rid not in self.run_ids:
                self.run_ids.append(rid)
            if not self._accept(e, upd, rounds_batch):
                continue
            upd.events += 1
            self.n_events += 1
            if self.t0 is None:
                self.t0 = _num(e.get("time"))
            t = _num(e.get("time"))
            if math.isfinite(t) and (self.latest is None or t > self.latest):
                self.latest = t
            kind = e.get("event")
            if kind == "run_start":
                self.start = dict(e)
                self.t0 = _num(e.get("time"))
                for w in e.get("workers") or []:
                    if isinstance(w, Mapping) and isinstance(w.get("name"), str):
                        self._worker(w["name"])
                upd.meta = True
            elif kind == "round":
                if self._round(e):
                    if upd.rounds_from is None:
                        upd.rounds_from = self.n_rounds - 1
                    rounds_batch.append(e)
            elif kind == "partition":
                self._partition(e, upd)
            elif kind == "score":
                self._score(e)
                upd.scores = True
            elif kind in ("worker_lost", "worker_joined", "checkpoint"):
                self._marker(e, upd)
            elif kind == "run_end":
                self.end = dict(e)
                upd.meta = True
            # Unknown event types are ignored (docs/runlog.md: readers must).
        self._summarize(rounds_batch)
        return upd

    def _accept(self, e: Mapping[str, Any], upd: Update, batch: list) -> bool:
        rid = e.get("run_id")
        if self.fixed_run_id is not None:
            return rid == self.fixed_run_id
        if self.run_id is None:
            self.run_id = rid if isinstance(rid, str) else None
            return True
        if rid == self.run_id:
            return True
        if e.get("event") == "run_start":
            # A new run appended to the same file: follow it, as a live view should.
            self._summarize(batch)
            batch.clear()
            self._clear(rid if isinstance(rid, str) else None)
            upd.reset = True
            upd.rounds_from = None
            upd.markers_from = None
            return True
        return False

    def _rel(self, e: Mapping[str, Any]) -> float:
        t = _num(e.get("time"))
        return t - self.t0 if self.t0 is not None and math.isfinite(self.t0) else math.nan

    def _worker(self, name: str) -> int:
        i = self._widx.get(name)
        if i is None:
            i = self._widx[name] = len(self.workers)
            self.workers.append(name)
            for m in (self.busy, self.comm, self.idle, self.rows, self.part_rows, self.scores):
                m.add_cols(len(self.workers))
        return i

    def _round(self, e: Mapping[str, Any]) -> bool:
        wall = _num(e.get("wall_s"))
        if not math.isfinite(wall):
            return False  # summarize skips such rounds too
        per = e.get("workers") if isinstance(e.get("workers"), Mapping) else {}
        for name in per:
            self._worker(str(name))
        self.round_no.push(_num(e.get("round")))
        self.round_t.push(self._rel(e))
        self.wall.push(wall)
        self.loss.push(_num(e.get("loss")))
        self.val.push(_num(e.get("val_score")))
        busy, comm, idle, rows = (m.append() for m in (self.busy, self.comm, self.idle, self.rows))
        for name, w in per.items():
            if not isinstance(w, Mapping):
                continue
            i = self._widx[str(name)]
            busy[i] = _num(w.get("busy_s"))
            comm[i] = _num(w.get("comm_s"))
            rows[i] = _num(w.get("rows"))
            idle_i = _num(w.get("idle_s"))
            if not math.isfinite(idle_i) and math.isfinite(busy[i]):
                idle_i = max(0.0, wall - busy[i] - (comm[i] if math.isfinite(comm[i]) else 0.0))
            idle[i] = idle_i
        return True

    def _partition(self, e: Mapping[str, Any], upd: Update) -> None:
        rows = e.get("rows") if isinstance(e.get("rows"), Mapping) else {}
        for name in rows:
            self._worker(str(name))
        self.part_round.push(_num(e.get("round")))
        self.part_t.push(self._rel(e))
        row = self.part_rows.append()
        row[:] = 0.0  # a worker not named holds no rows
        for name, n in rows.items():
            row[self._widx[str(name)]] = _num(n)
        upd.partitions = True
        moves = e.get("moves") if isinstance(e.get("moves"), list) else []
        moved = _num(e.get("rows_moved"))
        if moves or (math.isfinite(moved) and moved > 0):
            moved_txt = f"{int(moved):,} rows" if math.isfinite(moved) else "rows"
            label = f"re-balance after round {e.get('round')}: {moved_txt} in {len(moves)} moves"
            self._add_marker(e, "re-balance", label, upd)

    def _score(self, e: Mapping[str, Any]) -> None:
        name = e.get("worker")
        if not isinstance(name, str):
            return
        i = self._worker(name)
        rnd = _num(e.get("round"))
        n = self.score_round.n
        if n == 0 or not (self.score_round.values[-1] == rnd):
            # Carry the other workers' latest scores forward to this round, except for
            # workers lost since: they have no share until they are back.
            prev = self.scores.values[-1].copy() if n else None
            if prev is not None and self._lost:
                prev[[j for j in self._lost if j < len(prev)]] = np.nan
            self.scores.append(prev)
            self.score_round.push(rnd)
            self.score_t.push(self._rel(e))
        self.scores.values[-1, i] = _num(e.get("score"))

    def _marker(self, e: Mapping[str, Any], upd: Update) -> None:
        kind = e["event"].replace("_", " ")
        worker = e.get("worker")
        if isinstance(worker, str) and kind != "checkpoint":
            i = self._worker(worker)
            if kind == "worker lost":
                self._lost.add(i)
            else:
                self._lost.discard(i)
        if kind == "checkpoint":
            label = f"checkpoint after round {e.get('round')}: {e.get('path')}"
        elif kind == "worker lost":
            label = f"worker {worker} lost in round {e.get('round')}"
            if e.get("reason"):
                label += f": {e.get('reason')}"
        else:
            label = f"worker {worker} joined after round {e.get('round')}"
        self._add_marker(e, kind, label, upd)

    def _add_marker(self, e: Mapping[str, Any], kind: str, label: str, upd: Update) -> None:
        if upd.markers_from is None:
            upd.markers_from = len(self.markers)
        rnd = e.get("round")
        self.markers.append(
            {
                "t": self._rel(e),
                "round": rnd if isinstance(rnd, int) else None,
                "kind": kind,
                "label": label,
            }
        )

    # -- summary ------------------------------------------------------------------------

    def _summarize(self, batch: Sequence[Mapping[str, Any]]) -> None:
        """Add the new rounds to the run's totals (the run log's own :class:`RunTotals`),
        so a poll costs what was appended, not the whole run again."""
        for e in batch:
            self._totals.add(e)

    def _logged_summary(self) -> Mapping[str, Any]:
        """``run_end``'s summary (``hmdspt.core.runlog.summarize`` in the writer), or {}."""
        s = (self.end or {}).get("summary")
        return s if isinstance(s, Mapping) else {}

    def summary(self) -> dict:
        """Idle fractions, utilisation, mean speeds and efficiency of the run so far.

        :func:`hmdspt.core.runlog.summarize`'s round-derived keys, from the same
        :class:`hmdspt.core.runlog.RunTotals`, added up poll by poll. Utilisation and
        ``fit_wall_s`` are ``run_end``'s summary's once the run has ended; before, busy
        seconds so far over :func:`hmdspt.core.runlog.fit_wall_time` up to the latest event.
        """
        logged = self._logged_summary()
        logged_workers = logged.get("workers")
        if not isinstance(logged_workers, Mapping):
            logged_workers = {}
        fit_wall = finite(logged.get("fit_wall_s"))
        if fit_wall is None:
            fit_wall = fit_wall_time(self.start, self.end, self.latest)
        out = {"run_id": self.run_id, **self._totals.summary(fit_wall)}
        for name, w in out["workers"].items():
            mine = logged_workers.get(name)
            util = finite(mine.get("utilisation")) if isinstance(mine, Mapping) else None
            if util is not None:
                w["utilisation"] = util
        fastest = out["fastest_worker"]
        out["fastest_utilisation"] = out["workers"][fastest]["utilisation"] if fastest else None
        return out

    # -- series for the charts ----------------------------------------------------------

    def timeline(self, first: int, last: int | None = None) -> dict[str, dict[str, np.ndarray]]:
        """Busy, communication and idle intervals of rounds ``first:last``, per worker.

        A round ends at its event's time and started ``wall_s`` before; within it a worker
        computes first (busy), then communicates, then waits (idle) for the barrier.

        Returns
        -------
        segments : dict
            ``{"busy"|"comm"|"idle": {"worker", "left", "right", "round", "seconds"}}``,
            arrays with one entry per worker and round (workers absent from a round are
            left out).
        """
        last = self.n_rounds if last is None else last
        sl = slice(first, last)
        end = self.round_t.values[sl]
        begin = end - self.wall.values[sl]
        busy = np.nan_to_num(self.busy.values[sl], nan=0.0)
        comm = np.nan_to_num(self.comm.values[sl], nan=0.0)
        present = np.isfinite(self.busy.values[sl]) | np.isfinite(self.idle.values[sl])
        idle = self.idle.values[sl]
        start = begin[:, None]
        t_busy = start + busy
        t_comm = t_busy + comm
        # Idle is what is left of the round (the logged idle_s, else the remainder).
        t_idle = np.where(np.isfinite(idle), t_comm + np.nan_to_num(idle), end[:, None])
        names = np.asarray(self.workers, dtype=object)
        r_idx, w_idx = np.nonzero(present)
        rnd = self.round_no.values[sl][r_idx]
        who = names[w_idx] if len(names) else np.asarray([], dtype=object)
        out = {}
        for kind, lo, hi in (
            ("busy", np.broadcast_to(start, busy.shape), t_busy),
            ("comm", t_busy, t_comm),
            ("idle", t_comm, t_idle),
        ):
            left, right = lo[r_idx, w_idx], hi[r_idx, w_idx]
            out[kind] = {
                "worker": who.tolist(),
                "left": left,
                "right": right,
                "round": rnd,
                "seconds": right - left,
            }
        return out

    def time_span(self, first: int, last: int | None = None) -> tuple[float, float] | None:
        """Wall-time span of rounds ``first:last``: the first one's start to the last one's
        end, in seconds since ``t0`` (the x range of :meth:`timeline`'s segments).

        Returns
        -------
        span : tuple of float or None
            ``(start, end)``; None if those rounds have no finite time.
        """
        sl = slice(first, self.n_rounds if last is None else last)
        end = self.round_t.values[sl]
        edges = np.r_[end - self.wall.values[sl], end]
        edges = edges[np.isfinite(edges)]
        return (float(edges.min()), float(edges.max())) if len(edges) else None

    def shares(self, max_points: int = 400) -> dict[str, dict[str, list]]:
        """Each worker's share of the rows (partitions) and of the scores, over rounds.

        Returns
        -------
        shares : dict
            ``{"rows": {...}, "score": {...}}``, each ``{"worker", "xs", "ys"}`` lists for
            a multi-line glyph: rounds and fractions (0-1), drawn as steps (a share holds
            until the next event) up to the last round read. Series of more than
            ``max_points`` events are thinned to every k-th one (the last always kept), so
            a long run stays cheap to draw.
        """
        out = {}
        for key, x, m in (
            ("rows", self.part_round.values, self.part_rows.values),
            ("score", self.score_round.values, self.scores.values),
        ):
            if len(x) == 0:
                out[key] = {"worker": [], "xs": [], "ys": []}
                continue
            total = np.nansum(m, axis=1, keepdims=True)
            with np.errstate(invalid="ignore", divide="ignore"):
                share = np.where(total > 0, m / total, np.nan)
            if len(x) > max_points:
                step = math.ceil(len(x) / max_points)
                keep = np.unique(np.r_[np.arange(0, len(x), step), len(x) - 1])
                x, share = x[keep], share[keep]
            # Shares hold from one partition (or score update) to the next, and the
            # trainer logs scores only when they change the partition: draw steps, up to
            # the last round read, so a run that never re-balances still shows its line.
            last = self.round_no.values[-1] if self.n_rounds else x[-1]
            x = np.r_[np.repeat(x, 2)[1:], max(last, x[-1])]
            share = np.repeat(share, 2, axis=0)
            out[key] = {
                "worker": list(self.workers[: share.shape[1]]),
                "xs": [x] * share.shape[1],
                "ys": [share[:, i] for i in range(share.shape[1])],
            }
        return out


# --------------------------------------------------------------------------------------
# Comparing two runs
# --------------------------------------------------------------------------------------


def _run_events(events: Sequence[Mapping[str, Any]], run_id: str | None) -> list:
    if run_id is None:
        for e in reversed(events):
            if isinstance(e.get("run_id"), str):
                run_id = e["run_id"]
                break
    return [e for e in events if e.get("run_id") == run_id]


def _curves(events: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Validation scores and training losses against seconds since the run's start.

    The validation curve includes the warm-start score (``warm_start`` event) when there is
    one; the loss curve is the rounds' only.
    """
    t0 = math.nan
    for e in events:
        if e.get("event") == "run_start":
            t0 = _num(e.get("time"))
            break
    if not math.isfinite(t0) and events:
        t0 = _num(events[0].get("time"))
    out: dict[str, list] = {"val_t": [], "val": [], "loss_t": [], "loss": []}
    for e in events:
        # The warm-started model's score (before round one) starts the validation curve,
        # as it starts the estimator's ``eval_curve_``; it has no training loss.
        if e.get("event") not in ("round", "warm_start"):
            continue
        t = _num(e.get("time")) - t0
        for key, field in (("val", "val_score"), ("loss", "loss")):
            v = _num(e.get(field))
            if math.isfinite(v) and math.isfinite(t):
                out[f"{key}_t"].append(t)
                out[key].append(v)
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def compare_runs(
    a: Sequence[Mapping[str, Any]] | str | os.PathLike,
    b: Sequence[Mapping[str, Any]] | str | os.PathLike,
    target: float | None = None,
) -> dict:
    """Two runs side by side: fastest worker's idle, time to a target score, final score.

    Parameters
    ----------
    a, b : list of dict or path
        The runs' events (or log files); a file holding several runs gives its last run.
        Malformed lines and events are left out (:func:`hmdspt.core.runlog.event_problem`).
    target : float, optional
        Validation score to reach. Default: the lower of the two runs' best validation
        scores minus 0.01, so both runs reach it and the time compares like with like.

    Returns
    -------
    comparison : dict
        ``target``, ``target_is_default`` and ``runs``: two dicts with ``run_id``,
        ``partition`` and ``sync`` (from the config), ``emulation`` (its label or None),
        ``status``, ``rounds``, ``wall_s`` (Σ round wall), ``efficiency``,
        ``fastest_worker``, ``fastest_idle_fraction``, ``best_val_score``,
        ``final_val_score`` (the last validation score logged),
        ``time_to_target_s`` (seconds from ``run_start`` to the end of the first round
        whose validation score is at least the target; None if never reached),
        ``final_loss`` (the last training loss logged) and the curves ``val_t``, ``val``
        and ``loss_t``, ``loss`` (seconds since ``run_start``) for the charts.
    """
    runs = []
    for src in (a, b):
        if isinstance(src, (str, os.PathLike)):
            events = read_events(src)  # skips malformed lines and events
        else:  # events from elsewhere get the same check
            events = [e for e in src if event_problem(e) is None]
        mine = _run_events(events, None)
        s = summarize(mine)
        curves = _curves(mine)
        vs = curves["val"]
        start = next((e for e in mine if e.get("event") == "run_start"), None)
        cfg = (start or {}).get("config") or {}
        runs.append(
            {
                "run_id": s["run_id"],
                "partition": cfg.get("partition") if isinstance(cfg, Mapping) else None,
                "sync": cfg.get("sync") if isinstance(cfg, Mapping) else None,
                "emulation": emulation_label(cfg),
                "status": s["status"] or ("running" if mine else None),
                "rounds": s["rounds"],
                "wall_s": s["wall_s"],
                "efficiency": s["efficiency"],
                "fastest_worker": s["fastest_worker"],
                "fastest_idle_fraction": s["fastest_idle_fraction"],
                "best_val_score": float(vs.max()) if len(vs) else None,
                "final_val_score": float(vs[-1]) if len(vs) else None,
                "final_loss": float(curves["loss"][-1]) if len(curves["loss"]) else None,
                **curves,
            }
        )
    is_default = target is None
    if is_default:
        bests = [r["best_val_score"] for r in runs]
        target = None if None in bests else min(bests) - 0.01
    for r in runs:
        r["time_to_target_s"] = None
        if target is not None and len(r["val"]):
            hit = np.nonzero(r["val"] >= target)[0]
            if len(hit):
                r["time_to_target_s"] = float(r["val_t"][hit[0]])
    return {"target": target, "target_is_default": is_default, "runs": runs}
