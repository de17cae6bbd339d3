"""The HMDSPT monitor: a Panel app that watches run logs, and nothing else.

It reads only run logs (``docs/runlog.md``) through :mod:`hmdspt.app.rundata`; it never talks to
the cluster or the trainer and never unpickles anything. Per run it shows:

- a timeline, one row per worker, of each round's busy, communication and idle seconds
  along wall time (the picture in which a fast worker waits), and each worker's idle
  fraction over the whole run beside its utilisation (compute seconds over the fit's wall
  time from the user's call), both from :func:`hmdspt.core.runlog.summarize`;
- each worker's share of the rows (``partition`` events) against its share of the scores
  (``score`` events), over rounds;
- training loss and validation score against wall time, with markers for re-balances,
  lost and joined workers and checkpoints;
- on a second tab, two runs side by side (e.g. HMDSPT against equal shares).

Live: a periodic callback polls the log with :class:`hmdspt.core.runlog.RunLogTail`, which
reads only the bytes appended since the previous poll; the charts are updated by streaming
the new rounds (timeline, loss, score, markers), re-sending small aggregates (idle bars,
thinned share lines) and patching the share lines' ends to the last round, so watching a long
run stays cheap.

Use::

    panel serve app/monitor.py --args RUNS_PATH      # a folder of *.jsonl or one log
    # in a notebook
    import panel as pn; pn.extension(inline=True)
    from hmdspt.app.monitor import dashboard
    dashboard("runs/")

Bokeh and Panel JavaScript must come from the server, never a CDN: serve with
``BOKEH_RESOURCES=server`` (``hmdspt.app.cli.monitor_main`` sets it).
"""

from __future__ import annotations

import html
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import panel as pn
import param
from bokeh.models import (
    ColumnDataSource,
    DataRange1d,
    FactorRange,
    HoverTool,
    Legend,
    NumeralTickFormatter,
    Range1d,
    Span,
    Title,
)
from bokeh.palettes import Category10_10, Category20_20, turbo
from bokeh.plotting import figure
from bokeh.transform import dodge

from hmdspt.app.rundata import (
    MARKER_KINDS,
    RunData,
    RunInfo,
    Update,
    compare_runs,
    emulation_label,
    list_runs,
)
from hmdspt.core.prediction import counted

__all__ = ["Comparison", "Monitor", "RunMonitor", "dashboard", "served_page"]

log = logging.getLogger("hmdspt.monitor")

#: A running fit that writes no event for this long gets a note that its driver may have
#: stopped: rounds log every few seconds; staging or an evaluation can take minutes.
STALLED_AFTER_S = 300.0

KIND_COLORS = {"busy": "#3182bd", "comm": "#fd8d3c", "idle": "#de2d26"}
KIND_LABELS = {"busy": "busy (computing)", "comm": "communication", "idle": "idle (waiting)"}
MARKER_STYLE = {
    "re-balance": ("#6a51a3", "diamond"),
    "worker lost": ("#cb181d", "x"),
    "worker joined": ("#238b45", "triangle"),
    "checkpoint": ("#636363", "square"),
}
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
IDLE_COLUMNS = (
    "worker",
    "idle_pct",
    "util_pct",
    "fit_wall_s",
    "busy_s",
    "comm_s",
    "idle_s",
    "speed",
)


def _palette(n: int) -> list[str]:
    if n <= 10:
        return list(Category10_10[:n])
    if n <= 20:
        return list(Category20_20[:n])
    return list(turbo(n))


def _natural(name: str) -> list:
    """Sort key of a worker name: digit runs compare as numbers (w2 < w10)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def _e(x: Any) -> str:
    """HTML-escape text from a log: a log is data, never markup."""
    return html.escape(str(x))


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def _secs(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if x < 120:
        return f"{x:.1f} s"
    if x < 7200:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.2f} h"


class _Message(pn.pane.HTML):
    """An alert box whose text is shown as text.

    ``pn.pane.Alert`` renders its text as Markdown, so text from a log could add images
    and links (``![s](http://...)`` makes the browser fetch that URL): this pane has the
    Alert's look but is HTML of escaped text.
    """

    _stylesheets = pn.pane.Alert._stylesheets


def _stalled_text(silent_s: float, latest: float) -> str:
    """The note on a running fit that has logged nothing for ``silent_s`` seconds."""
    minutes = silent_s / 60
    ago = f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(latest))
    return (
        f"No event for {ago} (the last at {at}), and the run has not ended: its driver may "
        "have stopped without writing run_end (killed, or its machine lost). A fit in one "
        "long step, such as staging a large data set, writes nothing meanwhile."
    )


def _message(text: str, kind: str = "info") -> _Message:
    """A readable message in place of charts (``kind``: info, warning, danger).

    ``text`` is plain text (it may come from a log): it is escaped here, never markup.
    """
    return _Message(
        _e(text),
        css_classes=["hm-message", "alert", f"alert-{kind}"],
        sizing_mode="stretch_width",
    )


def _one_line(exc: BaseException) -> str:
    """An error as one line, ``Type: first line of its message``, never a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _figure(css: str, **kwargs: Any) -> figure:
    kwargs.setdefault("tools", TOOLS)
    kwargs.setdefault("toolbar_location", "above")
    kwargs.setdefault("sizing_mode", "stretch_width")
    p = figure(**kwargs)
    # Panel does not render css_classes of a Bokeh pane; on the figure they are (tests
    # find the charts by them).
    p.css_classes = ["hm-chart", css]
    p.title.text_font_size = "11pt"
    return p


# --------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------


class RunMonitor(param.Parameterized):
    """Header and charts of one run, updated from its log by :meth:`poll`.

    Parameters
    ----------
    path : str
        The run log.
    timeline_rounds : int
        Rounds shown in the timeline (the most recent ones).
    max_points : int
        Most points per line of the share chart (longer runs are thinned).
    """

    path = param.String(doc="The run log.")
    timeline_rounds = param.Integer(
        default=30, bounds=(1, 2000), doc="Rounds shown in the timeline (the latest ones)."
    )
    max_points = param.Integer(
        default=300, bounds=(10, 10_000), doc="Most points per share line (thinned beyond)."
    )
    shares_interval_s = param.Number(
        default=5.0, bounds=(0, None), doc="Least seconds between re-sends of the share lines."
    )
    revision = param.Integer(
        default=0, precedence=-1, doc="Bumped when the layout must be rebuilt."
    )
    tick = param.Integer(default=0, precedence=-1, doc="Bumped when new events arrived.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.data = RunData(self.path)
        self.error: str | None = None
        self.failed = False  # an unexpected error: the run's state is not to be trusted
        self.last_poll_s = 0.0
        self._built_with_rounds = False
        self._workers: list[str] = []
        self._shares_pending = False
        self._shares_sent = -math.inf
        self._make_charts()
        self.poll()

    # -- charts -------------------------------------------------------------------------

    def _make_charts(self) -> None:
        # New lists for each source: streaming extends a list column in place, and one list
        # shared by the three sources grew three times as fast as the others.
        self.seg_src = {
            k: ColumnDataSource({c: [] for c in ("worker", "left", "right", "round", "seconds")})
            for k in KIND_COLORS
        }
        tl = _figure(
            "hm-timeline",
            # Set to the shown rounds on each update: a DataRange1d kept its start at 0 as
            # old rounds rolled off, squeezing the latest ones into a sliver.
            x_range=Range1d(0, 1),
            y_range=FactorRange(),
            height=260,
            title="Each round per worker: busy, communication, idle (latest rounds)",
            x_axis_label="wall time since run start (s)",
        )
        items = []
        for kind, color in KIND_COLORS.items():
            r = tl.hbar(
                y="worker",
                left="left",
                right="right",
                height=0.8,
                source=self.seg_src[kind],
                fill_color=color,
                line_color=None,
            )
            items.append((KIND_LABELS[kind], [r]))
        tl.add_layout(Legend(items=items, orientation="horizontal"), "above")
        tl.add_tools(
            HoverTool(
                tooltips=[
                    ("worker", "@worker"),
                    ("round", "@round"),
                    ("seconds", "@seconds{0.000}"),
                ]
            )
        )
        tl.ygrid.grid_line_color = None
        self.fig_timeline = tl

        self.idle_src = ColumnDataSource({k: [] for k in IDLE_COLUMNS})
        ib = _figure(
            "hm-idle",
            x_range=FactorRange(),
            height=300,
            title="Idle and utilisation per worker",
            y_axis_label="% of wall time",
            tools="save",
        )
        bars = [
            ib.vbar(
                x=dodge("worker", offset, range=ib.x_range),
                top=column,
                width=0.38,
                source=self.idle_src,
                color=color,
            )
            for offset, column, color in (
                (-0.2, "idle_pct", KIND_COLORS["idle"]),
                (0.2, "util_pct", KIND_COLORS["busy"]),
            )
        ]
        ib.add_layout(
            Legend(
                items=[("idle, % of rounds", [bars[0]]), ("utilisation, % of fit", [bars[1]])],
                orientation="horizontal",
                label_text_font_size="9pt",
            ),
            "above",
        )
        ib.add_tools(
            HoverTool(
                tooltips=[
                    ("worker", "@worker"),
                    ("idle", "@idle_pct{0.0} % of its rounds' wall time"),
                    ("utilisation", "@util_pct{0.0} % of the fit's @fit_wall_s{0.0} s"),
                    ("busy / comm / idle", "@busy_s{0.0} / @comm_s{0.0} / @idle_s{0.0} s"),
                    ("mean speed", "@speed{0,0} rows/s"),
                ]
            )
        )
        self.idle_subtitle = Title(text="", text_font_style="italic", text_font_size="10pt")
        ib.add_layout(self.idle_subtitle, "above")
        ib.y_range.start = 0
        ib.xgrid.grid_line_color = None
        ib.xaxis.major_label_orientation = 0.8
        self.fig_idle = ib

        self.loss_src = ColumnDataSource({"t": [], "loss": [], "round": []})
        self.val_src = ColumnDataSource({"t": [], "val": [], "round": []})
        self.marker_src = ColumnDataSource(
            {k: [] for k in ("t", "kind", "label", "color", "marker")}
        )
        t_label = "wall time since run start (s)"
        lf = _figure(
            "hm-loss",
            height=210,
            title="Training loss",
            y_axis_label="loss",
            x_axis_label=t_label,
        )
        lf.line("t", "loss", source=self.loss_src, color="#3182bd", line_width=1.5)
        lf.add_tools(HoverTool(tooltips=[("round", "@round"), ("loss", "@loss{0.0000}")]))
        vf = _figure(
            "hm-val",
            height=210,
            x_range=lf.x_range,
            title="Validation score",
            y_axis_label="score",
            x_axis_label=t_label,
        )
        vf.line("t", "val", source=self.val_src, color="#31a354", line_width=1.5)
        vf.scatter("t", "val", source=self.val_src, color="#31a354", size=4)
        vf.add_tools(HoverTool(tooltips=[("round", "@round"), ("score", "@val{0.0000}")]))
        for f in (lf, vf):
            # Vertical lines at re-balances, lost/joined workers and checkpoints.
            f.vspan(
                x="t",
                source=self.marker_src,
                line_color="color",
                line_alpha=0.45,
                line_dash="dashed",
            )
        ef = _figure(
            "hm-events",
            height=150,
            x_range=lf.x_range,
            y_range=FactorRange(*reversed(MARKER_KINDS)),
            title="Events",
            x_axis_label=t_label,
        )
        ef.scatter("t", "kind", source=self.marker_src, color="color", marker="marker", size=11)
        ef.add_tools(HoverTool(tooltips=[("", "@label")]))
        self.fig_loss, self.fig_val, self.fig_events = lf, vf, ef

        self.rows_share_src = ColumnDataSource({"worker": [], "xs": [], "ys": [], "color": []})
        self.score_share_src = ColumnDataSource({"worker": [], "xs": [], "ys": [], "color": []})
        sf = _figure(
            "hm-shares",
            height=300,
            title="Share of rows (wide) vs share of score (dashed) per worker",
            x_axis_label="round",
            y_axis_label="share",
            # From 0: equal shares (a third each) would otherwise span an axis of rounding
            # noise, every tick reading "33 %".
            y_range=DataRange1d(start=0),
        )
        sf.multi_line(
            "xs",
            "ys",
            source=self.rows_share_src,
            line_color="color",
            line_width=6,
            line_alpha=0.35,  # wide and pale: the score line on top stays visible ...
            legend_field="worker",
        )
        sf.multi_line(
            "xs",
            "ys",
            source=self.score_share_src,
            line_color="color",
            line_width=1.8,
            line_dash="dashed",  # ... even where rows follow scores exactly (HMDSPT)
        )
        sf.add_tools(HoverTool(tooltips=[("worker", "@worker")]))
        sf.yaxis.formatter = NumeralTickFormatter(format="0 %")
        legend = sf.legend[0]
        legend.title = "worker"
        legend.label_text_font_size = "9pt"
        sf.add_layout(legend, "right")  # beside the plot: lines never hide under it
        self.fig_shares = sf

    # -- updates ------------------------------------------------------------------------

    def poll(self) -> Update | None:
        """Read what was appended to the log and update the charts with it.

        Returns
        -------
        update : Update or None
            What changed (None if the log could not be read; :attr:`error` says why).
        """
        if self.failed:
            return None
        start = time.perf_counter()
        try:
            upd = self.data.poll()
        except OSError as exc:  # removed, unreadable: say so on the page, keep polling
            if self.error is None:
                self.error = f"cannot read {self.path}: {exc}"
                self.revision += 1
            return None
        except Exception as exc:  # a log the checks did not foresee: this run only
            return self._fail(exc)
        if self.error is not None:
            self.error = None
            self.revision += 1
        try:
            if upd.changed:
                self._apply(upd)
                self.tick += 1
            else:
                self._flush_shares()
        except Exception as exc:
            return self._fail(exc)
        self.last_poll_s = time.perf_counter() - start
        return upd

    def _fail(self, exc: Exception) -> None:
        """Stop following this run and show why in one line (the trace goes to the log)."""
        log.exception("the monitor cannot show %s", self.path)
        self.failed = True
        self.error = f"Cannot show {Path(self.path).name}: {_one_line(exc)}"
        self.revision += 1

    def _apply(self, upd: Update) -> None:
        d = self.data
        workers_changed = sorted(d.workers) != sorted(self._workers)
        if workers_changed:
            # Shown in natural order of their names (worker-2 before worker-10), whatever
            # order the log named them in (the trainer lists them by address).
            self._workers = sorted(d.workers, key=_natural)
            self.fig_timeline.y_range.factors = list(reversed(self._workers))
            self.fig_timeline.height = int(min(720, max(200, 60 + 22 * len(self._workers))))
            self.fig_idle.x_range.factors = list(self._workers)
        n = d.n_rounds
        if upd.reset or workers_changed:
            self.refresh_timeline()
        elif upd.rounds_from is not None:
            new = d.timeline(max(upd.rounds_from, n - self.timeline_rounds))
            keep = self.timeline_rounds * max(1, len(self._workers))
            for kind, src in self.seg_src.items():
                src.stream(new[kind], rollover=keep)
            self._set_timeline_range()
        if upd.reset:
            self._set_series(0)
        elif upd.rounds_from is not None:
            self._stream_series(upd.rounds_from)
        # Every event moves a running fit's wall time, so its utilisation (run_end: the
        # logged summary's); the idle bars change with rounds only.
        self._set_idle()
        if upd.reset:
            self.marker_src.data = self._markers(0)
        elif upd.markers_from is not None:
            self.marker_src.stream(self._markers(upd.markers_from))
        if upd.reset or workers_changed:
            self._set_shares()
        elif upd.partitions or upd.scores:
            self._shares_pending = True
        self._flush_shares()
        if upd.rounds_from is not None:
            self._extend_shares()
        if (n > 0) != self._built_with_rounds or upd.reset:
            self._built_with_rounds = n > 0
            self.revision += 1  # from a message to charts (or back): rebuild the layout

    @param.depends("timeline_rounds", watch=True)
    def refresh_timeline(self) -> None:
        """Re-send the timeline's window (after a change of width or of the workers)."""
        d = self.data
        new = d.timeline(max(0, d.n_rounds - self.timeline_rounds))
        for kind, src in self.seg_src.items():
            src.data = new[kind]
        self._set_timeline_range()

    def _set_timeline_range(self) -> None:
        """Fit the timeline's x axis (and its reset tool) to the rounds shown."""
        span = self.data.time_span(max(0, self.data.n_rounds - self.timeline_rounds))
        if span is None:  # no round with a finite time: keep the axis as it is
            return
        start, end = span
        end = max(end, start + 1e-3)  # a range of zero width draws nothing
        self.fig_timeline.x_range.update(start=start, end=end, reset_start=start, reset_end=end)

    def _set_series(self, first: int) -> None:
        self.loss_src.data = self._series(first, "loss")
        self.val_src.data = self._series(first, "val")
        self._val_title()

    def _stream_series(self, first: int) -> None:
        self.loss_src.stream(self._series(first, "loss"))
        val = self._series(first, "val")
        if len(val["t"]):
            self.val_src.stream(val)
        self._val_title()

    def _val_title(self) -> None:
        # Rounds log val_score null when the run has no validation split (or it was not
        # evaluated that round): say so rather than show an empty frame.
        n = int(np.isfinite(self.data.val.values).sum())
        text = "Validation score" if n else "Validation score (none logged in this run yet)"
        if self.fig_val.title.text != text:
            self.fig_val.title.text = text

    def _series(self, first: int, key: str) -> dict[str, np.ndarray]:
        d = self.data
        t = d.round_t.values[first:]
        rnd = d.round_no.values[first:]
        y = (d.loss if key == "loss" else d.val).values[first:]
        if key == "val":  # validation is logged only on some rounds
            ok = np.isfinite(y)
            t, rnd, y = t[ok], rnd[ok], y[ok]
        return {"t": t.copy(), key: y.copy(), "round": rnd.copy()}

    def _set_idle(self) -> None:
        s = self.data.summary()
        rows: dict[str, list] = {k: [] for k in IDLE_COLUMNS}
        fit_wall = s["fit_wall_s"] if s["fit_wall_s"] is not None else math.nan
        for name in self._workers:
            w = s["workers"].get(name)
            if w is None:
                continue
            rows["worker"].append(name)
            for column, key in (("idle_pct", "idle_fraction"), ("util_pct", "utilisation")):
                rows[column].append(100 * w[key] if w[key] is not None else math.nan)
            rows["fit_wall_s"].append(fit_wall)
            for k in ("busy_s", "comm_s", "idle_s"):
                rows[k].append(w[k])
            rows["speed"].append(w["mean_speed"] if w["mean_speed"] is not None else math.nan)
        self.idle_src.data = rows
        fastest = s["fastest_worker"]
        # Two lines: on one, a long worker name ran past the narrow column's edge.
        self.idle_subtitle.text = (
            f"fastest: {fastest}\nidle {_pct(s['fastest_idle_fraction'])}, "
            f"utilisation {_pct(s['fastest_utilisation'])}"
            if fastest
            else ""
        )

    def _markers(self, first: int) -> dict[str, list]:
        ms = self.data.markers[first:]
        return {
            "t": [m["t"] for m in ms],
            "kind": [m["kind"] for m in ms],
            "label": [m["label"] for m in ms],
            "color": [MARKER_STYLE[m["kind"]][0] for m in ms],
            "marker": [MARKER_STYLE[m["kind"]][1] for m in ms],
        }

    def _flush_shares(self) -> None:
        # The share lines are re-sent whole (a thinned line cannot be streamed), which for
        # 64 workers is ~10x the bytes of a poll's other updates: at most every
        # shares_interval_s seconds.
        if self._shares_pending and time.monotonic() - self._shares_sent >= self.shares_interval_s:
            self._set_shares()

    def _set_shares(self) -> None:
        sh = self.data.shares(self.max_points)
        colors = dict(zip(self._workers, _palette(len(self._workers))))
        for key, src in (("rows", self.rows_share_src), ("score", self.score_share_src)):
            s = sh[key]
            # In display order, which is also the legend's.
            order = sorted(range(len(s["worker"])), key=lambda i: _natural(s["worker"][i]))
            workers = [s["worker"][i] for i in order]
            src.data = {
                "worker": workers,
                # float32 halves the bytes sent; shares need no more precision.
                "xs": [np.asarray(s["xs"][i], dtype=np.float32) for i in order],
                "ys": [np.asarray(s["ys"][i], dtype=np.float32) for i in order],
                "color": [colors.get(w, "#888888") for w in workers],
            }
        self._shares_pending = False
        self._shares_sent = time.monotonic()

    def _extend_shares(self) -> None:
        """Move the share lines' last point to the last round read.

        A share holds until the next partition or score event, which may come rounds
        later (or never, once the run ends); the throttled re-send would leave the lines
        short of the last round meanwhile. Patching one number per line is cheap.
        """
        d = self.data
        last = float(d.round_no.values[-1]) if d.n_rounds else math.nan
        if not math.isfinite(last):
            return
        for src in (self.rows_share_src, self.score_share_src):
            patches = [
                ((i, len(x) - 1), [last])
                for i, x in enumerate(src.data["xs"])
                if len(x) and x[-1] < last  # never shorten a line
            ]
            if patches:
                src.patch({"xs": patches})

    # -- views --------------------------------------------------------------------------

    def header_html(self) -> str:
        """The header: run, status, ``rounds: N``, efficiency, emulation note."""
        d = self.data
        s = d.summary()
        start = d.start or {}
        ds = start.get("dataset") if isinstance(start.get("dataset"), dict) else {}
        model = start.get("model") if isinstance(start.get("model"), dict) else {}
        cfg = d.config
        status = d.status
        color = {"running": "#3182bd", "completed": "#238b45", "failed": "#cb181d"}.get(
            status, "#636363"
        )
        parts = [
            f"<b>{_e(d.run_id or d.path.name)}</b>",
            f'<span class="hm-status" style="color:{color}">{_e(status)}</span>',
            f'<span class="hm-rounds">rounds: {d.n_rounds}</span>',
            f"workers: {len(d.workers)}",
            f"round wall Σ {_secs(s['wall_s'])}",
            f"parallel efficiency {_pct(s['efficiency'])}",
        ]
        if s["fastest_worker"]:
            util = f"utilisation {_pct(s['fastest_utilisation'])}"
            if s["fit_wall_s"] is not None:
                util += f" of the {_secs(s['fit_wall_s'])} fit"
            parts.append(
                f"fastest worker {_e(s['fastest_worker'])} idle "
                f"{_pct(s['fastest_idle_fraction'])} · {util}"
            )
        lines = [" · ".join(parts)]
        facts = []
        if cfg.get("partition"):
            facts.append(f"partition={_e(cfg['partition'])}")
        if cfg.get("sync"):
            facts.append(f"sync={_e(cfg['sync'])}")
        if ds:
            name = ds.get("name", "data")
            n = ds.get("n_samples", ds.get("n_rows"))  # the trainer writes n_rows
            n = f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else _e(n or "?")
            facts.append(f"{_e(name)}: {n} rows × {_e(ds.get('n_features', '?'))} features")
        if model.get("layers"):
            facts.append(
                "MLP "
                + "-".join(_e(v) for v in model["layers"])
                + (f" ({_e(model['n_params'])} parameters)" if model.get("n_params") else "")
            )
        facts.append(f"log {_e(d.path.name)}")
        lines.append(" · ".join(facts))
        emu = emulation_label(cfg)
        if emu:
            lines.append(f'<span class="hm-emulated"><b>{_e(emu)}</b></span>')
        return '<div class="hm-header">' + "<br>".join(lines) + "</div>"

    def notes(self) -> list[pn.viewable.Viewable]:
        """Alerts about the state of the log (failed run, torn line, skipped lines)."""
        d = self.data
        out = []
        if d.end is not None and d.status != "completed":
            reason = d.end.get("reason")
            kind = "danger" if d.status == "failed" else "warning"
            text = f"Run {d.status} after {counted(d.n_rounds, 'round')}"
            text += f": {reason}" if reason else " (no reason logged)."
            out.append(_message(text, kind))
        silent = d.silent_for(time.time())
        if silent is not None and silent >= STALLED_AFTER_S:
            out.append(_message(_stalled_text(silent, d.latest), "warning"))
        if d.torn_bytes:
            out.append(
                _message(
                    f"The last line of the log is incomplete ({d.torn_bytes} bytes): an event "
                    "being written, or the writer stopped mid-line. It is ignored until its "
                    "newline arrives.",
                    "warning",
                )
            )
        if d.skipped_lines:
            out.append(self._skipped_note())
        if len(d.run_ids) > 1:
            out.append(
                _message(f"This file holds {len(d.run_ids)} runs; showing {d.run_id}.", "info")
            )
        return out

    def _skipped_note(self) -> pn.viewable.Viewable:
        n = self.data.skipped_lines
        what = "line/event" if n == 1 else "lines/events"
        return _message(
            f"The monitor skipped {n} malformed {what} of this log: not JSON, too long or "
            "too deeply nested, or fields of the wrong type (a crash, corruption, or a "
            "writer that does not follow docs/runlog.md).",
            "warning",
        )

    @param.depends("tick", "revision")
    def header(self) -> pn.viewable.Viewable:
        """Header and notes; re-rendered (cheap HTML) when new events arrive."""
        if self.error:
            return _message(self.error, "danger")
        try:
            return self._header()
        except Exception as exc:  # one line on the page, never a traceback
            log.exception("the monitor cannot show %s", self.path)
            return _message(f"Cannot show {Path(self.path).name}: {_one_line(exc)}", "danger")

    def _header(self) -> pn.viewable.Viewable:
        d = self.data
        if d.n_events == 0:
            if d.skipped_lines:
                text = (
                    f"The run log {d.path.name} holds no valid event yet. The page updates "
                    "as events arrive."
                )
                return pn.Column(
                    _message(text, "info"), self._skipped_note(), sizing_mode="stretch_width"
                )
            if d.torn_bytes:
                text = (
                    f"The run log {d.path.name} has no complete event yet, only an "
                    f"unfinished line of {d.torn_bytes} bytes. The page updates as events "
                    "arrive."
                )
            else:
                text = (
                    f"The run log {d.path.name} is empty: the run has not written its "
                    "first event yet. The page updates as events arrive."
                )
            return _message(text, "info")
        items: list[Any] = [pn.pane.HTML(self.header_html(), sizing_mode="stretch_width")]
        items += self.notes()
        if d.n_rounds == 0:
            items.append(
                _message(
                    f"No training round logged yet ({d.n_events} events so far). The charts "
                    "appear with the first round.",
                    "info",
                )
            )
        return pn.Column(*items, sizing_mode="stretch_width")

    @param.depends("revision")
    def charts(self) -> pn.viewable.Viewable:
        """The charts, or nothing until the first round (the header says why)."""
        if self.error or self.data.n_rounds == 0:
            return pn.Spacer(height=0)
        try:
            return self._charts()
        except Exception as exc:  # one line on the page, never a traceback
            log.exception("the monitor cannot draw the charts of %s", self.path)
            return _message(f"Cannot draw {Path(self.path).name}: {_one_line(exc)}", "danger")

    def _charts(self) -> pn.viewable.Viewable:
        bokeh = {"sizing_mode": "stretch_width"}
        return pn.Column(
            pn.Row(
                pn.Column(pn.pane.Bokeh(self.fig_timeline, **bokeh), sizing_mode="stretch_width"),
                pn.Column(pn.pane.Bokeh(self.fig_idle, **bokeh), width=360),
                sizing_mode="stretch_width",
            ),
            pn.Row(
                pn.Column(
                    pn.pane.Bokeh(self.fig_loss, **bokeh),
                    pn.pane.Bokeh(self.fig_val, **bokeh),
                    pn.pane.Bokeh(self.fig_events, **bokeh),
                    sizing_mode="stretch_width",
                ),
                pn.Column(pn.pane.Bokeh(self.fig_shares, **bokeh), sizing_mode="stretch_width"),
                sizing_mode="stretch_width",
            ),
            sizing_mode="stretch_width",
        )

    def panel(self) -> pn.viewable.Viewable:
        """Header and charts of this run."""
        return pn.Column(
            pn.panel(self.header, sizing_mode="stretch_width"),
            pn.panel(self.charts, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )


# --------------------------------------------------------------------------------------
# Two runs side by side
# --------------------------------------------------------------------------------------


class Comparison(param.Parameterized):
    """Two runs side by side: fastest worker's idle, time to target score, final score.

    Parameters
    ----------
    run_a, run_b : str
        Log files (paths) to compare.
    target : float or None
        Validation score to reach; None: the lower of the two best scores minus 0.01.
    """

    run_a = param.Selector(default=None, objects=[], allow_None=True, label="Run A")
    run_b = param.Selector(default=None, objects=[], allow_None=True, label="Run B")
    target = param.Number(
        default=None, allow_None=True, label="Target validation score (empty: default)"
    )

    def __init__(self, runs: list[RunInfo] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self._cache: dict[tuple, dict] = {}
        self.set_runs(runs or [])

    def set_runs(self, runs: list[RunInfo]) -> None:
        """Offer these runs; pick the newest and the newest with another partition."""
        options = {r.label: str(r.path) for r in runs}
        for p in (self.param.run_a, self.param.run_b):
            p.objects = list(options.values())
            p.names = options
        paths = list(options.values())
        # Defaults: logs that have events, newest first; B with another partition than A
        # when there is one (HMDSPT against equal shares is the comparison that matters).
        useful = [r for r in runs if r.size > 0 and r.run_id is not None] or runs
        if self.run_a not in paths:
            self.run_a = str(useful[0].path) if useful else None
        if self.run_b not in paths or self.run_b == self.run_a:
            first = next((r for r in runs if str(r.path) == self.run_a), None)
            part = first.config.get("partition") if first is not None else None
            rest = [r for r in useful if str(r.path) != self.run_a]
            other = [r for r in rest if part and r.config.get("partition") not in (None, part)]
            self.run_b = str((other or rest)[0].path) if (other or rest) else None

    def result(self) -> dict | None:
        """:func:`hmdspt.app.rundata.compare_runs` of the selected runs (cached by file state)."""
        if not self.run_a or not self.run_b:
            return None
        key = []
        for p in (self.run_a, self.run_b):
            st = os.stat(p)
            key.append((p, st.st_mtime_ns, st.st_size))
        key = (*key, self.target)
        if key not in self._cache:
            self._cache.clear()  # one comparison at a time: logs can be large
            self._cache[key] = compare_runs(self.run_a, self.run_b, self.target)
        return self._cache[key]

    @param.depends("run_a", "run_b", "target")
    def view(self) -> pn.viewable.Viewable:
        """The table and the validation curves with the target line."""
        if not self.run_a or not self.run_b:
            return _message("Comparing needs two run logs; this folder has fewer.", "info")
        try:
            return self._view(self.result())
        except OSError as exc:
            return _message(f"Cannot read a run log: {exc}", "danger")
        except Exception as exc:  # one line on the page, never a traceback
            log.exception("the monitor cannot compare %s and %s", self.run_a, self.run_b)
            return _message(f"Cannot compare these runs: {_one_line(exc)}", "danger")

    def _view(self, res: dict) -> pn.viewable.Viewable:
        runs = res["runs"]
        if any(r["run_id"] is None for r in runs):
            return _message("One of the two logs holds no event yet.", "info")
        target = res["target"]
        tgt = "n/a (a run has no validation score)" if target is None else f"{target:.4f}"
        if res["target_is_default"] and target is not None:
            tgt += " (default: lower best score − 0.01)"
        names = [Path(p).name for p in (self.run_a, self.run_b)]

        def cell(r: dict, key: str) -> str:
            v = r[key]
            if key in ("fastest_idle_fraction", "efficiency"):
                return _pct(v)
            if key == "time_to_target_s":
                return "not reached" if v is None else _secs(v)
            if key in ("best_val_score", "final_val_score", "final_loss"):
                return "n/a" if v is None else f"{v:.4f}"
            if key == "fastest_worker":
                return "n/a" if v is None else _e(v)
            if key == "wall_s":
                return _secs(v)
            return _e(v)

        rows = [
            ("partition", "partition"),
            ("sync", "sync"),
            ("status", "status"),
            ("rounds", "rounds"),
            ("fastest worker", "fastest_worker"),
            ("fastest worker's idle", "fastest_idle_fraction"),
            ("parallel efficiency", "efficiency"),
            ("time to target score", "time_to_target_s"),
            ("best validation score", "best_val_score"),
            ("final validation score", "final_val_score"),
            ("final training loss", "final_loss"),
            ("Σ round wall", "wall_s"),
        ]
        body = "".join(
            f"<tr><th style='text-align:left'>{label}</th>"
            f"<td class='hm-cmp-a-{key}'>{cell(runs[0], key)}</td>"
            f"<td class='hm-cmp-b-{key}'>{cell(runs[1], key)}</td></tr>"
            for label, key in rows
        )
        # One note per emulated run, naming it: a set of labels shown once called both runs
        # emulated when only one was, and showed one of two different emulations.
        note = "".join(
            f"<p class='hm-cmp-{name.lower()}-emulation'><b>{name}: {_e(r['emulation'])}</b></p>"
            for r, name in zip(runs, ("A", "B"))
            if r["emulation"]
        )
        table = (
            f"<table class='hm-compare' style='border-collapse:collapse' cellpadding='4'>"
            f"<tr><th></th><th>A: {_e(names[0])}</th><th>B: {_e(names[1])}</th></tr>"
            f"{body}</table><p>target validation score: {tgt}</p>{note}"
        )
        charts = []
        has_val = any(len(r["val"]) for r in runs)
        for key, title, y_label in (
            ("val", "Validation score against wall time", "validation score"),
            ("loss", "Training loss against wall time", "training loss"),
        ):
            if key == "val" and not has_val:
                continue
            p = _figure(
                "hm-compare-chart" if key == "val" or not has_val else "hm-compare-loss",
                height=300,
                title=title,
                x_axis_label="seconds since run start",
                y_axis_label=y_label,
            )
            for r, color, name in zip(runs, ("#3182bd", "#e6550d"), ("A", "B")):
                src = ColumnDataSource({"t": r[f"{key}_t"], "y": r[key]})
                what = [str(v) for v in (r["partition"], r["sync"]) if v]
                label = f"{name}: {', '.join(what) or r['run_id']}"
                p.line("t", "y", source=src, color=color, line_width=2, legend_label=label)
                p.scatter("t", "y", source=src, color=color, size=4)
            if key == "val" and target is not None:
                p.add_layout(Span(location=target, dimension="width", line_dash="dashed"))
            p.legend.location = "bottom_right" if key == "val" else "top_right"
            charts.append(pn.pane.Bokeh(p, sizing_mode="stretch_width"))
        if not has_val:
            table += "<p>No validation score in either run: the chart shows training loss.</p>"
        return pn.Column(
            pn.pane.HTML(table, sizing_mode="stretch_width"),
            pn.Row(*charts, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )

    def panel(self) -> pn.viewable.Viewable:
        """Pickers, target input and the comparison."""
        return pn.Column(
            pn.Row(
                pn.widgets.Select.from_param(self.param.run_a, width=420),
                pn.widgets.Select.from_param(self.param.run_b, width=420),
                pn.widgets.FloatInput.from_param(self.param.target, width=260),
            ),
            pn.panel(self.view, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )


# --------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------


class Monitor(param.Parameterized):
    """The whole monitor: run picker, the selected run, the comparison; live polling.

    Parameters
    ----------
    path : str
        A folder of run logs (``*.jsonl``) or one log file.
    run : str
        The selected log (a path among the listed ones).
    live : bool
        Poll the selected log for new events.
    poll_ms : int
        Polling period in milliseconds.
    """

    path = param.String(doc="A folder of run logs or one log file.")
    run = param.Selector(default=None, objects=[], allow_None=True, label="Run log")
    live = param.Boolean(default=True, label="Live")
    poll_ms = param.Integer(default=1000, bounds=(100, 60_000), doc="Polling period (ms).")
    timeline_rounds = param.Integer(default=30, bounds=(1, 2000), label="Rounds in timeline")
    message = param.String(default="", precedence=-1, doc="Why there is no run to show.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.current: RunMonitor | None = None
        self.comparison = Comparison()
        self._callback = None
        self._polls = 0
        self.refresh_runs()
        if self.current is None:
            self._select()

    def refresh_runs(self) -> None:
        """List the logs again (new runs appear in the picker, newest first)."""
        try:
            runs = list_runs(self.path)
        except (FileNotFoundError, NotADirectoryError):
            runs, msg = [], f"There is no run log or folder at {self.path}."
        except OSError as exc:
            runs, msg = [], f"Cannot list {self.path}: {exc}"
        else:
            msg = (
                ""
                if runs
                else f"No run logs (*.jsonl) in {self.path} yet. Start a run that writes "
                "its log there; this page lists new logs as they appear."
            )
        options = {r.label: str(r.path) for r in runs}
        if list(options.values()) != list(self.param.run.objects) or (
            options != getattr(self.param.run, "names", None)
        ):
            self.param.run.objects = list(options.values())
            self.param.run.names = options
            self.comparison.set_runs(runs)
        self.message = msg
        if self.run not in options.values():
            self.run = next(iter(options.values()), None)

    @param.depends("run", watch=True)
    def _select(self) -> None:
        self.current = (
            RunMonitor(path=self.run, timeline_rounds=self.timeline_rounds) if self.run else None
        )

    @param.depends("timeline_rounds", watch=True)
    def _timeline_width(self) -> None:
        if self.current is not None:
            self.current.timeline_rounds = self.timeline_rounds

    def poll(self) -> None:
        """One tick of the periodic callback: tail the selected log, re-list now and then."""
        self._polls += 1
        # Listing a folder costs a stat per log: every ~5 s is enough to see new runs.
        if self._polls % max(1, 5000 // self.poll_ms) == 0:
            self.refresh_runs()
        if self.live and self.current is not None:
            self.current.poll()

    def start(self) -> None:
        """Start polling (a session-scoped periodic callback in a server)."""
        if self._callback is None:
            self._callback = pn.state.add_periodic_callback(self.poll, period=self.poll_ms)

    @param.depends("run", "message")
    def run_view(self) -> pn.viewable.Viewable:
        """The selected run's header and charts, or why there is none."""
        if self.current is None:
            return _message(self.message or "No run selected.", "info")
        return self.current.panel()

    def panel(self) -> pn.viewable.Viewable:
        """The page: title, run picker and controls, then tabs Run and Compare."""
        controls = pn.Row(
            pn.widgets.Select.from_param(self.param.run, width=520),
            pn.widgets.IntSlider.from_param(self.param.timeline_rounds, end=300, width=220),
            pn.widgets.Checkbox.from_param(self.param.live, width=80, align="end"),
            sizing_mode="stretch_width",
        )
        return pn.Column(
            pn.pane.HTML(
                "<h2 style='margin:4px 0'>HMDSPT monitor</h2>"
                f"<span style='color:#636363'>run logs: {_e(self.path)}</span>",
                sizing_mode="stretch_width",
            ),
            controls,
            pn.Tabs(
                ("Run", pn.panel(self.run_view, sizing_mode="stretch_width")),
                ("Compare", self.comparison.panel()),
                dynamic=True,  # the comparison reads two whole logs: only when shown
                sizing_mode="stretch_width",
            ),
            sizing_mode="stretch_width",
            css_classes=["hm-monitor"],
        )


def dashboard(
    path: str | os.PathLike,
    *,
    run: str | None = None,
    live: bool = True,
    poll_ms: int = 1000,
    timeline_rounds: int = 30,
) -> pn.viewable.Viewable:
    """The monitor's layout for a folder of run logs or one log, e.g. in a notebook.

    Parameters
    ----------
    path : str or path-like
        A folder of run logs (``*.jsonl``) or one log file.
    run : str, optional
        File name (within the folder) of the log to show first; the newest by default.
    live : bool, default=True
        Poll the log for new events (in a notebook, only while the kernel is idle).
    poll_ms : int, default=1000
        Polling period in milliseconds.
    timeline_rounds : int, default=30
        Rounds shown in the timeline.

    Returns
    -------
    layout : panel.viewable.Viewable
        Its ``monitor`` attribute is the :class:`Monitor`.
    """
    monitor = Monitor(
        path=os.fspath(path), live=live, poll_ms=poll_ms, timeline_rounds=timeline_rounds
    )
    if run:
        # Only a name among the listed logs: a URL argument must not open arbitrary files.
        match = [p for p in monitor.param.run.objects if Path(p).name == Path(run).name]
        if match:
            monitor.run = match[0]
    layout = monitor.panel()
    layout.monitor = monitor
    monitor.start()
    return layout


def _served() -> pn.viewable.Viewable:
    """The page of ``panel serve app/monitor.py --args RUNS_PATH``."""
    args = pn.state.session_args or {}

    def arg(name: str) -> str | None:
        v = args.get(name)
        return v[0].decode("utf-8", "replace") if v else None

    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HMDSPT_RUNS", "runs")
    poll = arg("poll_ms")
    poll_ms = int(poll) if poll and poll.isdigit() else 1000
    return served_page(path, run=arg("run"), poll_ms=max(100, min(poll_ms, 60_000)))


def served_page(
    path: str | os.PathLike, *, run: str | None = None, poll_ms: int = 1000
) -> pn.viewable.Viewable:
    """A server session's page: :func:`dashboard`, or one line saying why it failed.

    A browser never gets a traceback (with the installation's paths); the server's log
    keeps it.
    """
    try:
        return dashboard(path, run=run, poll_ms=poll_ms)
    except Exception as exc:  # a readable page, never a blank one
        log.exception("the monitor failed to build its page")
        return _message(f"The monitor could not start: {_one_line(exc)}", "danger")


if __name__.startswith("bokeh_app") or __name__ == "__main__":
    pn.extension()
    _served().servable(title="HMDSPT monitor")
