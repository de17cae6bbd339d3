"""The README's test command, timed side by side against another revision.

Issue 16, point 8 bounds the README's test command, run in a fresh clone and a fresh venv on
this 2-core machine, at half of the 280 s it took when the issue was filed (revision
``e05e48c``). On a shared machine a bare number moves with the hour, so this times both
suites in turns, each in its own fresh clone and venv, and prints their ratio::

    python -m benchmarks.bench_suite                   # this checkout's HEAD against e05e48c
    python -m benchmarks.bench_suite --runs 2 --tests-only

The command is each revision's own, read from its README. The machine is used as it is:
the optional parts (chromium, a running SLURM, the peers' venv) that are present are used
by both suites, and the line before the results says which are. Nothing is left behind but
pytest's own folders under the system's temporary directory and, for a command that failed,
its whole output in ``benchmarks/out/suite-<side>-<run>.txt`` (the line after the run says
so).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ._common import busy_cpu_seconds
from .report import OUT, copy_file

ROOT = Path(__file__).resolve().parents[1]
FILED_AT = "e05e48c"  # the revision issue 16 was filed at
BOUND_S = 140.0  # half of the 280 s the issue measured


def readme_commands(readme: str) -> list[str]:
    """The set-up commands of a README: every non-empty line of its ```bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def readme_test_command(readme: str) -> str:
    """The README's test command (the set-up command that runs pytest)."""
    return next(c for c in readme_commands(readme) if "pytest" in c)


@dataclass
class Timing:
    """One timed run of a revision's test command."""

    side: str
    revision: str
    seconds: float
    busy: float  # core-seconds the whole machine was busy
    returncode: int
    summary: str  # the command's last line: pytest's summary
    failures: list[str]  # pytest's FAILED and ERROR lines (-ra): the clone is gone after


def _fresh_env(venv: Path) -> dict[str, str]:
    """The environment of a shell that has just activated ``venv``."""
    env = dict(os.environ)
    # A user's shell has none of these (PYTHONDONTWRITEBYTECODE would make every test
    # process compile from source what the install left uncompiled: uv, as pip's
    # --no-compile, compiles no bytecode at install).
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "HMDSPT_REQUIRE_ALL"):
        env.pop(name, None)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def time_command(side: str, revision: str, work: Path, tests_only: bool) -> Timing:
    """Clone ``revision`` into ``work``, make a fresh venv and time its README's test command
    (only its pytest part, after the install, with ``tests_only``)."""
    clone, venv = work / "repo", work / "venv"
    # Resolved here, where a branch name means this checkout's branch, not the clone's.
    commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    command = readme_test_command((clone / "README.md").read_text())
    env = _fresh_env(venv)
    log = work / "output.txt"
    with log.open("w") as out:
        if tests_only:
            *install, command = command.split(" && ")
            subprocess.run(
                ["bash", "-c", " && ".join(install)],
                cwd=clone,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
            )
        busy0, start = busy_cpu_seconds(), time.perf_counter()
        done = subprocess.run(
            ["bash", "-c", command], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        seconds, busy = time.perf_counter() - start, busy_cpu_seconds() - busy0
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    short = _git("rev-parse", "--short", commit)
    failures = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    summary = lines[-1] if lines else ""
    return Timing(side, short, seconds, busy, done.returncode, summary, failures)


def _git(*args: str) -> str:
    """The output of ``git ARGS`` in this checkout."""
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _parts_present() -> str:
    """Which optional parts the suites will find, as the tests look for them."""
    from .peers.install import installed_versions

    ping = shutil.which("scontrol") and subprocess.run(
        ["scontrol", "ping"], capture_output=True, text=True, timeout=15
    )
    present = {
        "chromium": Path("/usr/bin/chromium").exists(),  # tests/browser/harness.py
        "a running SLURM": bool(ping) and "UP" in ping.stdout,
        "the peers' venv": installed_versions() is not None,
    }
    return ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in present.items())


def main(argv: list[str] | None = None) -> int:
    """Time both suites in turns and print each run, the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=FILED_AT, help=f"revision (default {FILED_AT})")
    parser.add_argument("--runs", type=int, default=1, help="pairs, in turns (default 1)")
    parser.add_argument(
        "--tests-only", action="store_true", help="time only the pytest part, after each install"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs: expected a positive integer, got {args.runs}")
    what = "pytest part" if args.tests_only else "whole command, install included"
    print(f"# The README's test command ({what}), fresh clone and venv, in turns")
    print(f"machine: {os.cpu_count()} cores; optional parts: {_parts_present()}")
    cores = os.cpu_count() or 1
    timings: list[Timing] = []
    for run in range(1, args.runs + 1):
        for side, revision in (("against", args.against), ("this", "HEAD")):
            work = Path(tempfile.mkdtemp(prefix=f"hmdspt-suite-{side}-"))
            kept = None
            try:
                t = time_command(side, revision, work, args.tests_only)
                if t.returncode:  # the failures' messages, for whoever reads the run later
                    kept = copy_file(work / "output.txt", OUT / f"suite-{side}-{run}.txt")
            finally:
                shutil.rmtree(work, ignore_errors=True)
            timings.append(t)
            idle = cores * t.seconds - t.busy
            print(
                f"run {run} {side:>7} {t.revision}: {t.seconds:7.2f} s, busy {t.busy:.0f} "
                f"core-s, idle {idle:.0f}, rc {t.returncode}: {t.summary}"
            )
            for line in t.failures:
                print(f"    {line}")
            if kept is not None:
                print(f"    its whole output: {kept.relative_to(ROOT)}")
    medians = {
        s: statistics.median(t.seconds for t in timings if t.side == s) for s in ("against", "this")
    }
    print(
        f"median s: this {medians['this']:.2f}, against {medians['against']:.2f}; "
        f"ratio this/against {medians['this'] / medians['against']:.2f}"
    )
    if not args.tests_only:
        print(
            f"issue 16's bound: at most {BOUND_S:.0f} s (half of the 280 s measured at "
            f"{FILED_AT}); this: {medians['this']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
