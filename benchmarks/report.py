"""Build ``docs/performance.md`` from ``benchmarks/results.md`` and the suite's plots.

The page is generated: ``python -m benchmarks all`` (or a subset) calls :func:`build` after
writing ``results.md``; ``python -m benchmarks.report`` rebuilds the page from the existing
results and ``benchmarks/out/`` without measuring anything. It holds the measured tables
verbatim (each section of ``results.md``), grouped by the questions the project asks — how
much faster, which part buys it, does it hold at scale — and the PNG plots the benchmarks
drew in the runs those tables come from, copied to ``docs/performance/``. The page leads
with the figures measured on the OS-enforced testbed (``benchmarks/testbed.py``); figures of
the in-code emulation follow, labelled *emulated*. The headline figure,
``docs/performance/headline.png``, is drawn here from the idle benchmark's numbers
(``benchmarks/out/idle.json``), the testbed's first, after checking that they are the
numbers of its table.

A plot is used only if it belongs to the run whose table the page shows: a PNG written
outside the time span of its section's run is stale and left out, and the page says which
plot is missing and why. A figure already in ``docs/performance/`` is kept when its source
is gone (``benchmarks/out/`` is not committed) as long as the section it was copied with is
unchanged; the page records that provenance in an HTML comment per figure.

Every file is written to a temporary file in its directory and moved into place with
``os.replace``: an interrupted run leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
RESULTS = ROOT / "benchmarks" / "results.md"
PAGE = ROOT / "docs" / "performance.md"
HEADLINE = "headline.png"
IDLE_DATA = "idle.json"


# -- atomic files -----------------------------------------------------------------------


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` through ``write(binary_file)``: temp file in the same directory,
    fsync, ``os.replace``. On any error the temp file is removed and ``path`` untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def copy_file(src: str | Path, dst: str | Path) -> Path:
    def write(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f)

    return atomic_write(dst, write)


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        plt.close(fig)


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(ax, groups, series: dict, fmt: str = "{:.1f}") -> None:
    """Bars per group (x) and series (colour), each labelled with its value; None = n/a."""
    import numpy as np

    x = np.arange(len(groups))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        pos = x - 0.4 + width * (i + 0.5)
        heights = [0.0 if v is None else v for v in values]
        bars = ax.bar(pos, heights, width, label=label)
        for bar, v in zip(bars, values):
            ax.annotate(
                "n/a" if v is None else fmt.format(v),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(x, groups)
    ax.grid(axis="y", alpha=0.3)


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(ROOT))
    return str(path)


# -- results.md -------------------------------------------------------------------------

HEADING = re.compile(
    r"^## (?P<name>\S+) \((?P<took>\d+) s, (?P<status>.*?)"
    r"(?:, (?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d) UTC)?\)\s*$"
)


@dataclass
class Section:
    name: str
    heading: str  # the heading line without "## " and the newline
    body: str  # everything after the heading line
    took: float | None = None
    status: str = "unknown"
    finished: datetime.datetime | None = None  # end of the run, to the minute (UTC)

    @property
    def text(self) -> str:
        return f"## {self.heading}\n{self.body}"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def window(self) -> tuple[float, float] | None:
        """POSIX times between which this section's run wrote its files, if known."""
        if self.finished is None or self.took is None:
            return None
        end = self.finished.timestamp()  # truncated to the minute: the run ended before +60 s
        return end - self.took - 5.0, end + 65.0


def parse_sections(text: str) -> tuple[str, dict[str, Section]]:
    """The head of a results file and its ``## name (...)`` sections (outside code fences)."""
    chunks: list[tuple[str | None, list[str]]] = [(None, [])]
    fenced = False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            chunks.append((line[3:].rstrip("\n"), []))
            continue
        chunks[-1][1].append(line)
    sections: dict[str, Section] = {}
    for heading, lines in chunks[1:]:
        section = Section(name=heading.split(" ", 1)[0], heading=heading, body="".join(lines))
        m = HEADING.match(f"## {heading}")
        if m:
            section.took = float(m["took"])
            section.status = m["status"]
            if m["stamp"]:
                section.finished = datetime.datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M").replace(
                    tzinfo=datetime.UTC
                )
        sections[section.name] = section
    return "".join(chunks[0][1]), sections


def read_sections(path: str | Path) -> dict[str, Section]:
    path = Path(path)
    return parse_sections(path.read_text())[1] if path.exists() else {}


# -- what the page shows ----------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    file: str  # name in benchmarks/out/ and docs/performance/
    section: str  # the benchmark (results.md section) that draws it
    caption: str


@dataclass(frozen=True)
class Part:
    section: str
    title: str
    what: str
    figures: tuple[Figure, ...] = ()


IDLE_PART = Part(
    "idle",
    "Idle time and efficiency per speed mix: equal vs proportional shares",
    "The same HMDSPT fit with equal and with proportional shares, per speed mix; the fastest "
    "worker's idle fraction and the parallel efficiency from the run logs, the fit's wall "
    "time from the `fit()` call. On the testbed first (each mix as CPU quotas the kernel "
    "enforces, the mapping printed), then on the emulation (labelled emulated).",
    (
        Figure(
            "idle.png",
            "idle",
            "Fastest worker's idle time and parallel efficiency per speed mix: on the testbed "
            "(OS-enforced CPU quotas), then emulated.",
        ),
    ),
)

QUESTIONS: tuple[tuple[str, str, tuple[Part, ...]], ...] = (
    (
        "On the testbed: the headline figures",
        "Measured on the testbed (`benchmarks/testbed.py`, [docs/testbed.md](testbed.md)): "
        "every Dask worker runs in a cgroup whose CPU quota the kernel enforces and, for the "
        "communication table, behind a link shaped by `tc tbf`. Each benchmark prints the "
        "testbed's table first and then, labelled *emulated*, the same measurement on the "
        "in-code emulation. Times are the user's: from the `fit()` call, staging and the "
        "speed probe included.",
        (
            Part(
                "peers",
                "Against the peers: PyTorch DDP, Spark MLlib, scikit-learn, one process",
                "The embedded default data set (160,000 training rows, 40 features, 10 "
                "classes), MLP (128, 64), Adam, 8 epochs, on the testbed's three groups "
                "(quotas 1 / 0.5 / 0.25 core): `BPNNClassifier` and scikit-learn in one "
                "process in the 1-core group, HMDSPT with proportional and with equal shares, "
                "PyTorch DDP (gloo, `DistributedSampler`) at a global batch of about 256 and "
                "at 256 per rank, and Spark MLlib's multilayer perceptron with both solvers on "
                "a standalone cluster whose workers run in the groups. Target: scikit-learn's "
                "final test accuracy minus 1 point; times from each system's own start "
                "command or call, medians of the runs shown.",
            ),
            Part(
                "peers-10ms",
                "One process against HMDSPT at a 10 ms CFS period",
                "The same job with the kernel's CFS period at 10 ms instead of 100 ms, "
                "`BPNNClassifier` in one process in the 1-core group against HMDSPT with "
                "proportional and with equal shares, five runs each (issue 17 asks for the "
                "fit's wall time at most the one process's, at both periods).",
            ),
            Part(
                "testbed",
                "The testbed's own check and ceiling",
                "The quotas checked by the kernel's own CPU accounting, and the ceiling: each "
                "group's speed running the same training loop alone and all together, the "
                "groups combined against the fastest alone.",
            ),
            Part(
                "loop",
                "A worker's loop inside the rounds and alone",
                "Each worker's training speed in a fit's rounds against the same round task "
                "run on the same worker without the fit (alone, and all workers at once), "
                "per quota mix and CFS period: whether the rounds cost the loop speed beyond "
                "what sharing the host's cores costs.",
            ),
            IDLE_PART,
            Part(
                "training-testbed",
                "Time to accuracy on the testbed",
                "KDD Cup 99: HMDSPT against equal shares, local SGD and bulk-synchronous SGD "
                "on the testbed (quotas 1 / 0.5 / 0.25 core, the issue's 4:2:1), same data, "
                "model, time box and target as the emulated comparison below (in-process "
                "BPNNClassifier's final accuracy minus 1 point; the in-process fit runs in "
                "the driver, so only its accuracy counts).",
                (
                    Figure(
                        "kddcup99-testbed.png",
                        "training-testbed",
                        "KDD Cup 99 on the testbed: the fastest worker's idle time and held-out "
                        "accuracy against time, per run (OS-enforced CPU quotas).",
                    ),
                ),
            ),
            Part(
                "comm",
                "Communication at 10 Gbit/s, 1 Gbit/s and 100 Mbit/s",
                "Bytes a worker sends and receives per round and the wall time per round for "
                "dense, float16 and top-k deltas and for bulk-synchronous SGD, on the testbed "
                "with every worker's link shaped to each rate (the rate measured over TCP), "
                "then on the emulation over the loopback (links not shaped).",
            ),
            Part(
                "scaling",
                "1 to 4 workers",
                "Equal workers: on the testbed each with the same CPU quota (the speed-up is "
                "the method's own); on the emulation full-speed processes that past the core "
                "count share the cores (the overhead of more workers, not speed-up).",
                (
                    Figure(
                        "scaling.png",
                        "scaling",
                        "Epoch time, speed-up over one worker and parallel efficiency, 1 to 4 "
                        "workers: testbed (OS-enforced quotas) and emulated.",
                    ),
                ),
            ),
        ),
    ),
    (
        "How much faster?",
        "Training speed against scikit-learn on one core, and time to a target accuracy "
        "against the baselines on an emulated heterogeneous cluster (labelled emulated), at "
        "equal accuracy.",
        (
            Part(
                "kernel",
                "One-epoch throughput against scikit-learn",
                "Full-epoch training throughput of `BPNNClassifier` against "
                "`MLPClassifier`, one process, one BLAS thread; the three fits interleaved.",
                (
                    Figure(
                        "kernel.png",
                        "kernel",
                        "Samples per second of one training epoch (bars: median; dots: "
                        "each run), one process on this machine.",
                    ),
                ),
            ),
            Part(
                "training",
                "Time to accuracy against the baselines",
                "HMDSPT against equal shares, local SGD, bulk-synchronous SGD and in-process "
                "training, on `local_cluster(speeds=(4, 2, 1))` (heterogeneity emulated), "
                "on KDD Cup 99 and smartphone activity windows; then bytes sent per round. "
                "In the table HMDSPT starts from the speeds its workers remember from an "
                "untimed warm-up fit on the same cluster; the line 'with a fresh probe' "
                "gives its time to target as the first fit on a cluster. Times are seconds "
                "of training: scoring the held-out sample, which every run does at a "
                "relative resolution of 5 % in time, is not counted. On HAR the final "
                "accuracy is also compared seed by seed, since the in-process reference "
                "itself moves by about a point from seed to seed.",
                (
                    Figure(
                        "kddcup99.png",
                        "training",
                        "KDD Cup 99: the fastest worker's idle time and held-out accuracy "
                        "against time, per run (heterogeneity emulated).",
                    ),
                    Figure(
                        "har-windows.png",
                        "training",
                        "Smartphone activity windows: the same (heterogeneity emulated).",
                    ),
                    Figure(
                        "communication.png",
                        "training",
                        "Bytes a worker sends per round: dense, float16 and top-k 10 %.",
                    ),
                ),
            ),
            Part(
                "accuracy",
                "Same accuracy as scikit-learn",
                "Accuracy of `BPNNClassifier` and `MLPClassifier` with the same hyper-parameters.",
            ),
        ),
    ),
    (
        "Which part buys it?",
        "Where the time goes: each mechanism switched off in turn (emulated; the idle time "
        "with equal and with proportional shares is in the testbed's section above).",
        (
            Part(
                "ablation",
                "Ablation: each mechanism switched off in turn",
                "KDD Cup 99 on `local_cluster(speeds=(4, 2, 1))` (heterogeneity emulated): "
                "the full method, then without each mechanism, and with top-k compression.",
                (
                    Figure(
                        "ablation.png",
                        "ablation",
                        "Held-out accuracy over time, time to the target accuracy and the "
                        "fastest worker's idle time per variant (heterogeneity emulated).",
                    ),
                ),
            ),
            Part(
                "worth",
                "Is the cluster worth using? Issue 17's checks per mix and problem size",
                "Digits, the activity windows, KDD Cup 99 with MLP 41-64-32-5 and "
                "41-256-128-5 and the embedded default on `local_cluster(speeds=...)` at 4:2:1 "
                "and 8:2:1 (heterogeneity emulated): HMDSPT beside local averaging and bsp on "
                "equal shares; its row shares against the measured speeds, its predicted "
                "against its measured efficiency, and the seconds from `fit()` to the target.",
            ),
            Part(
                "worth-testbed",
                "The same checks on the testbed",
                "The same jobs and checks on the OS-enforced testbed: each speed mix as CPU "
                "quotas the kernel enforces (the mapping printed), CFS period 100 ms.",
            ),
            Part(
                "worth-testbed-10ms",
                "The same checks on the testbed at a 10 ms CFS period",
                "As above with the kernel's CFS period at 10 ms instead of 100 ms: a round "
                "then spans several periods, where at 100 ms a quota-throttled worker can run "
                "a short round in one burst at full speed.",
            ),
            Part(
                "ablation-startup",
                "Start-up: probe, warm start and ramp at four problem sizes",
                "Digits, the embedded default, the activity windows and KDD Cup 99 on "
                "`local_cluster(speeds=(4, 2, 1))` (heterogeneity emulated): seconds from the "
                "fit call to the target, with each start-up mechanism switched off in turn.",
            ),
        ),
    ),
    (
        "Does it hold at scale?",
        "On this machine only up to 4 workers fit (measured in the testbed's section above); "
        "beyond that the discrete-event simulator, calibrated against measured runs, predicts "
        "up to 4,096 workers.",
        (
            Part(
                "simulation",
                "Simulated: up to 4,096 workers",
                "The simulator checked against measured runs on the testbed and, the same "
                "way, on the emulation (validation: same metric and tolerance), then weak "
                "scaling and the driver's share of a round up to 4,096 workers (simulated, "
                "not measured on a cluster).",
                (
                    Figure(
                        "simulation-validation.png",
                        "simulation",
                        "Simulator against measured runs: on the testbed (OS-enforced CPU "
                        "quotas) and emulated.",
                    ),
                    Figure(
                        "simulation-scaling.png",
                        "simulation",
                        "Simulated weak scaling, equal vs proportional shares, flat vs tree merge.",
                    ),
                    Figure(
                        "simulation-driver.png",
                        "simulation",
                        "Simulated driver share of a round, flat vs tree reduction.",
                    ),
                ),
            ),
        ),
    ),
    (
        "Other measurements",
        "How the speed scores are measured, data staging, fault tolerance and the monitor.",
        (
            Part("scoring", "Speed probe", "Cost and accuracy of the per-worker speed probe."),
            Part("staging", "Data staging", "Time and memory to stage a data set on workers."),
            Part(
                "faults",
                "Fault injection",
                "Fits with killed, slowed and joining workers, a killed scheduler, and a killed "
                "or interrupted driver.",
            ),
            Part(
                "straggler",
                "A straggler mid-fit",
                "The fastest worker's idle after a worker slows down 4x mid-fit and the shares "
                "are re-balanced, beside equal shares (emulated).",
            ),
            Part("monitor", "Monitor", "Loading and live-updating the monitoring app."),
            Part(
                "threads",
                "Workers that are threads of the driver's process",
                "Fits on two worker threads with the fit's BLAS limit and without it, quiet "
                "and with one core busy elsewhere.",
            ),
        ),
    ),
)

FIGURES: tuple[Figure, ...] = tuple(
    f for _, _, parts in QUESTIONS for part in parts for f in part.figures
)

PROVENANCE = re.compile(r"^<!-- figure (?P<file>\S+) from section: (?P<heading>.*) -->$", re.M)


@dataclass
class Report:
    page: Path
    copied: list[str]  # figures copied from benchmarks/out/ (or drawn) in this build
    kept: list[str]  # figures kept from an earlier build of the same sections
    missing: dict[str, str]  # figure -> why it is not on the page


def _when(t: float) -> str:
    return f"{datetime.datetime.fromtimestamp(t, datetime.UTC):%Y-%m-%d %H:%M:%S} UTC"


def _unusable(src: Path, section: Section | None, name: str, timed: bool = True) -> str | None:
    """Why ``src`` cannot stand for ``section``'s run, or None if it can.

    With ``timed``, a file written outside the span of the section's run (when the
    section's heading gives its end time) is stale."""
    rerun = f"rerun `python -m benchmarks {name}`"
    if section is None:
        return f"not run: no `{name}` section in benchmarks/results.md ({rerun})"
    if not src.exists():
        if not section.ok:
            return f"the `{name}` benchmark {section.status}"
        return (
            f"`{shown(src)}` not found: the `{name}` run did not write it here "
            f"(benchmarks/out/ is not committed; {rerun})"
        )
    window = section.window() if timed else None
    mtime = src.stat().st_mtime
    if window is not None and not window[0] <= mtime <= window[1]:
        return (
            f"`{shown(src)}` is stale: written {_when(mtime)}, outside the `{name}` run "
            f"whose table this page shows ({section.heading}); {rerun}"
        )
    return None


IDLE_ROW = re.compile(
    r"^[ \t]*(?:(?P<cluster>testbed|emulated)[ \t]+)?(?P<speeds>\d+(?::\d+)+)[ \t]+"
    r"(?:[\d.]+(?:/[\d.]+)+[ \t]+)?(?P<partition>equal|proportional)[ \t]+"
    r"(?P<idle>\S+)[ \t]+(?P<eff>\S+)(?:[ \t]+\S+)+[ \t]*$",
    re.M,
)
TESTBED, EMULATED = "testbed", "emulated"


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}"


def _idle_mismatch(data: dict, section: Section) -> str | None:
    """Why ``idle.json`` does not hold the numbers of the idle table, or None if it does."""
    table = {
        (m["cluster"] or EMULATED, m["speeds"], m["partition"]): (m["idle"], m["eff"])
        for m in IDLE_ROW.finditer(section.body)
    }
    rows = data.get("results") or []
    if not rows or len(rows) != len(table):
        return f"it has {len(rows)} rows, the idle table {len(table)}"
    for r in rows:
        eff = "n/a" if r.get("efficiency") is None else f"{r['efficiency']:.2f}"
        kind = r.get("cluster", EMULATED)
        got = table.get((kind, r["speeds"], r["partition"]))
        if got != (_pct(r.get("fastest_idle")), eff):
            return f"{kind} {r['speeds']} {r['partition']}: {got} in the table"
    return None


def idle_clusters(data: dict) -> list[str]:
    """The clusters of ``idle.json``'s rows, the testbed first (rows without one: emulated)."""
    present = {r.get("cluster", EMULATED) for r in data.get("results") or []}
    return [k for k in (TESTBED, EMULATED) if k in present]


def draw_headline(data: dict, path: str | Path) -> Path:
    """The README's figure: fastest worker's idle %, equal vs proportional, per speed mix;
    one panel per cluster, the testbed's first, each labelled with its cluster."""
    plt = pyplot()
    kinds = idle_clusters(data)
    cores = data.get("machine", {}).get("cores")
    where = f"one {cores}-core machine" if cores else "one machine"
    labels = data.get("clusters", {})
    fig, axes = plt.subplots(
        1, len(kinds), figsize=(6.2 * len(kinds), 4.6), layout="constrained", squeeze=False
    )
    for ax, kind in zip(axes[0], kinds):
        rows = [r for r in data["results"] if r.get("cluster", EMULATED) == kind]
        mixes = list(dict.fromkeys(r["speeds"] for r in rows))
        by = {(r["speeds"], r["partition"]): r for r in rows}
        ticks = mixes
        if kind == TESTBED:
            ticks = [
                m
                + "\n"
                + "/".join(f"{c:.3g}" for c in by[(m, "equal")].get("cores") or [])
                + " core"
                if (m, "equal") in by
                else m
                for m in mixes
            ]
        grouped_bars(
            ax,
            ticks,
            {
                f"{p} shares": [
                    None
                    if by.get((m, p), {}).get("fastest_idle") is None
                    else 100 * by[(m, p)]["fastest_idle"]
                    for m in mixes
                ]
                for p in ("equal", "proportional")
            },
        )
        workers = len(mixes[0].split(":")) if mixes else 0
        if kind == TESTBED:
            title = labels.get(kind, "testbed (OS-enforced CPU quotas)")
            xlabel = f"speeds of the {workers} workers, as CPU quotas the kernel enforces"
        else:
            title = f"EMULATED on {where} (duty-cycle throttle)"
            xlabel = f"speeds of the {workers} workers (emulated)"
        ax.set(xlabel=xlabel, ylabel="fastest worker idle, % of round time", ylim=(0, 100))
        ax.set_title(title, fontsize=9, color="0.15" if kind == TESTBED else "0.35")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        "HMDSPT: the fastest worker's idle time, equal vs proportional shares\n"
        f"measured {data.get('measured', '?')} on {where} by `python -m benchmarks idle`",
        fontsize=10,
    )
    return save_figure(fig, path)


# -- the page ---------------------------------------------------------------------------


def _figure_block(fig: Figure, section: Section | None, state: str, why: str | None) -> str:
    if state == "missing":
        return f"> **Plot missing: `{fig.file}`** ({fig.caption.rstrip('.')}): {why}.\n"
    return (
        f"<!-- figure {fig.file} from section: {section.heading} -->\n"
        f"![{fig.caption}](performance/{fig.file})\n\n*{fig.caption}*\n"
    )


def _part_block(part: Part, section: Section | None, figure_blocks: list[str]) -> str:
    out = [f"### {part.title}\n", f"{part.what}\n"]
    if section is None:
        out.append(
            f"> **Not measured:** no `{part.section}` section in benchmarks/results.md "
            f"(run `python -m benchmarks {part.section}`).\n"
        )
    else:
        out.append(f"`python -m benchmarks {part.section}` — measured: {section.heading}\n")
        if not section.ok:
            out.append(f"> **This benchmark did not complete:** {section.status}.\n")
        out.append(section.body.strip("\n") + "\n")
    out.extend(figure_blocks)
    return "\n".join(out)


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def build(
    results: str | Path = RESULTS,
    out_dir: str | Path = OUT,
    page: str | Path = PAGE,
) -> Report:
    """Write ``page`` and its figures (in ``page`` without suffix, e.g. docs/performance/)."""
    results, out_dir, page = Path(results), Path(out_dir), Path(page)
    fig_dir = page.with_suffix("")
    head, sections = parse_sections(results.read_text()) if results.exists() else ("", {})
    previous = dict(
        (m["file"], m["heading"])
        for m in PROVENANCE.finditer(page.read_text() if page.exists() else "")
    )
    report = Report(page=page, copied=[], kept=[], missing={})

    def place(name: str, section: Section | None, why: str | None, make) -> tuple[str, str]:
        """Make figure ``name`` (or keep the earlier copy of the same section)."""
        dst = fig_dir / name
        if why is None:
            try:
                make(dst)
                report.copied.append(name)
                return "ok", ""
            except Exception as exc:  # one bad figure must not lose the page
                why = f"could not be written ({type(exc).__name__}: {exc})"
        if section is not None and dst.exists() and previous.get(name) == section.heading:
            report.kept.append(name)
            return "ok", ""
        with contextlib.suppress(FileNotFoundError):
            dst.unlink()
        report.missing[name] = why
        return "missing", why

    # Headline: drawn from the idle benchmark's numbers, if they are its table's numbers.
    idle = sections.get("idle")
    src = out_dir / IDLE_DATA
    # Checked by content, not by time: the numbers must be those of the idle table.
    why = _unusable(src, idle, "idle", timed=False)
    data = None
    if why is None:
        try:
            data = json.loads(src.read_text())
            bad = _idle_mismatch(data, idle)
            if bad is not None:
                why = (
                    f"`{shown(src)}` does not hold the numbers of the idle table ({bad}); "
                    "rerun `python -m benchmarks idle`"
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            why = f"`{shown(src)}` unreadable ({type(exc).__name__}: {exc})"
    headline_state, headline_why = place(HEADLINE, idle, why, lambda dst: draw_headline(data, dst))

    blocks: dict[tuple[str, str], str] = {}
    for _, _, parts in QUESTIONS:
        for part in parts:
            fig_blocks = []
            for fig in part.figures:
                section = sections.get(fig.section)
                src = out_dir / fig.file
                state, why = place(
                    fig.file,
                    section,
                    _unusable(src, section, fig.section),
                    lambda dst, src=src: copy_file(src, dst),
                )
                fig_blocks.append(_figure_block(fig, section, state, why))
            blocks[(part.section, part.title)] = _part_block(
                part, sections.get(part.section), fig_blocks
            )

    known = {part.section for _, _, parts in QUESTIONS for part in parts}
    extra = [s for name, s in sections.items() if name not in known]

    bullets = [line[2:].rstrip() for line in head.splitlines() if line.startswith("- ")]
    machine = next(
        (
            line.strip().removeprefix("machine:").split("; BLAS")[0].strip()
            for s in sections.values()
            for line in s.body.splitlines()
            if line.startswith("machine:")
        ),
        None,
    )
    cores = re.search(r"(\d+) cores", machine or "")
    where = f"one {cores[1]}-core machine" if cores else "one machine"

    lines = [
        "# Performance",
        "",
        "<!-- GENERATED by `python -m benchmarks.report` from benchmarks/results.md and "
        "benchmarks/out/*.png: do not edit by hand. -->",
        "",
        "> **Generated file — do not edit by hand.** Written by `python -m benchmarks.report`"
        " (which `python -m benchmarks all` runs last) from "
        "[`benchmarks/results.md`](../benchmarks/results.md) and the plots the benchmarks "
        "drew in the same runs.",
        "",
        "What HMDSPT's benchmark suite (`benchmarks/`) measured: every table below is copied "
        "verbatim from `benchmarks/results.md`, every plot was drawn by the run that printed "
        "its table, and ratios compare runs made side by side in one run.",
        "",
        f"**Two kinds of cluster, both on {where}.** Figures labelled **testbed "
        "(OS-enforced CPU quotas)** lead the page: every Dask worker runs in a cgroup whose "
        "CPU quota the kernel enforces (a speed mix such as 4:2:1 becomes quotas of 1 / 0.5 / "
        "0.25 core, the rest of the machine left to the scheduler and the driver) and, where "
        "a table says so, behind a link shaped by `tc tbf` ([docs/testbed.md](testbed.md)). "
        "Figures labelled **emulated** come from the in-code emulation: heterogeneity is "
        "EMULATED, a slower worker throttled by a duty cycle (after each compute chunk it "
        "sleeps (k - 1) times that chunk's CPU time), all workers, the scheduler and the "
        "driver sharing the same cores. The 4,096-worker figures come from the simulator, "
        "not from a cluster.",
        "",
        "**Regenerate:** `python -m benchmarks all` re-measures everything and rewrites "
        "`benchmarks/results.md`, the plots in `benchmarks/out/` and this page; "
        "`python -m benchmarks idle scaling` re-measures only those sections; "
        "`python -m benchmarks.report` rebuilds this page from the existing results and "
        "plots.",
        "",
    ]
    if bullets or machine:
        lines.append("Results file:")
        lines.append("")
        lines.extend(f"- {b}" for b in bullets)
        if machine:
            lines.append(f"- as the benchmarks print it: {machine}")
        lines.append("")
    if headline_state == "ok":
        kinds = idle_clusters(data) if data else None
        on = {
            None: "on the clusters the `idle` section names",
            (TESTBED, EMULATED): f"on the testbed (OS-enforced CPU quotas) and, right, "
            f"emulated on {where}",
            (TESTBED,): "on the testbed (OS-enforced CPU quotas)",
        }.get(
            None if kinds is None else tuple(kinds),
            f"heterogeneity emulated on {where} (no testbed rows in this run)",
        )
        lines += [
            f"![Fastest worker's idle time, equal vs proportional shares](performance/{HEADLINE})",
            "",
            "*Headline (drawn from the `idle` section's numbers): the fastest worker's idle "
            f"time per round with equal and with proportional shares, per speed mix; {on}.*",
            "",
        ]
        if idle is not None:
            lines += [f"<!-- figure {HEADLINE} from section: {idle.heading} -->", ""]
    else:
        lines += [f"> **Headline plot missing: `{HEADLINE}`**: {headline_why}.", ""]
    toc = [q for q, _, parts in QUESTIONS] + (["Not in the layout above"] if extra else [])
    lines += ["Contents: " + " · ".join(f"[{q}](#{_slug(q)})" for q in toc), ""]
    for question, intro, parts in QUESTIONS:
        lines += [f"## {question}", "", intro, ""]
        for part in parts:
            lines += [blocks[(part.section, part.title)]]
    if extra:
        lines += ["## Not in the layout above", ""]
        for s in extra:
            lines += [f"### {s.name}", "", f"measured: {s.heading}", "", s.body.strip("\n"), ""]
    write_text(page, "\n".join(lines).rstrip("\n") + "\n")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT, help="where the benchmarks' PNGs are")
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    if not args.results.exists():
        print(f"{args.results} not found: run `python -m benchmarks all` first")
        return 1
    report = build(args.results, args.out, args.page)
    print(f"wrote {shown(report.page)}: {len(report.copied)} figure(s) updated", end="")
    print(f", {len(report.kept)} kept from the same sections" if report.kept else "")
    for name, why in report.missing.items():
        print(f"  plot missing: {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
