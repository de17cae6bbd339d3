"""Helpers to serve the monitor with ``panel serve`` and drive headless Chromium.

Shared by ``tests/test_app_browser.py``, ``benchmarks/bench_monitor.py`` and
``scripts/make_screenshot.py``. Follows ``shared/recipes/browser-tests.md``: Debian's
``/usr/bin/chromium`` driven by the Python ``playwright`` package (never
``playwright install``), every outside host unresolvable, Bokeh/Panel JS served by the
app itself (``BOKEH_RESOURCES=server``), the server stopped by its own PID.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.ports import free_port  # chosen first: the websocket origin names it
from tests.requires import missing

# The installed app's file, wherever the installation put it (not the checkout's layout).
APP = Path(importlib.util.find_spec("hmdspt.app.monitor").origin)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    # Chromium phones Google at start; map every host but the app's to nothing.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
RENDERED_JS = """() => window.Bokeh !== undefined && Bokeh.documents.length > 0
    && Bokeh.documents[0].roots().length > 0 && Bokeh.documents[0].is_idle"""


def require_chromium() -> None:
    """Skip without Debian's chromium, naming the install (CI fails instead: it has it)."""
    if not CHROMIUM.exists():
        missing(
            f"the browser tests need {CHROMIUM}: "
            "apt-get install -y --no-install-recommends chromium fonts-dejavu-core"
        )


class PanelServer:
    """``panel serve app/monitor.py --args RUNS_PATH`` on a free port, as a subprocess.

    Parameters
    ----------
    runs_path : path
        Passed after ``--args``.
    log_dir : path
        Where the server's stdout and stderr go (``server.out``, ``server.err``).
    """

    def __init__(self, runs_path: os.PathLike, log_dir: os.PathLike, timeout: float = 60.0):
        self.runs_path = Path(runs_path)
        self.log_dir = Path(log_dir)
        self.timeout = timeout
        self.port = free_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.origin}/monitor"
        self.proc: subprocess.Popen | None = None

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / "server.err"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def __enter__(self) -> PanelServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, BOKEH_RESOURCES="server")
        cmd = [
            sys.executable, "-m", "panel", "serve", str(APP),
            "--address", "127.0.0.1", "--port", str(self.port),
            "--allow-websocket-origin", f"127.0.0.1:{self.port}",
            "--args", str(self.runs_path),
        ]  # fmt: skip
        with open(self.log_dir / "server.out", "wb") as out, open(self.stderr_path, "wb") as err:
            # No shell: the PID is the server's own, so stopping it stops nothing else.
            self.proc = subprocess.Popen(cmd, cwd=self.log_dir, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"panel serve exited early:\n{self.stderr()}")
            try:
                with urllib.request.urlopen(f"{self.origin}/static/js/bokeh.min.js", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"panel serve did not answer in {self.timeout} s:\n{self.stderr()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Chromium writes its crash-report settings and a dconf cache under the user's home even
# with a profile of its own: a folder of this test process instead, removed as it ends.
_BROWSER_HOME = tempfile.TemporaryDirectory(prefix="hmdspt-chromium-")


def launch_browser(playwright: Any) -> Any:
    """Headless Debian chromium with outside hosts blocked."""
    require_chromium()
    home = Path(_BROWSER_HOME.name)
    env = dict(os.environ, XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"))
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, env=env
    )


def wait_rendered(page: Any, timeout_ms: float = 30_000) -> None:
    """Wait until Bokeh has a document with roots and is idle (HTTP 200 proves nothing)."""
    page.wait_for_function(RENDERED_JS, timeout=timeout_ms)


def record_requests(page: Any) -> list[str]:
    """Every URL the page requests, appended as they happen (and websockets)."""
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.on("websocket", lambda ws: urls.append(ws.url))
    return urls


def foreign(urls: list[str], origin: str) -> list[str]:
    """URLs not on the app's own origin (http, ws, or Panel's blob: of that origin)."""
    host = origin.split("://", 1)[1]
    ok = (f"http://{host}/", f"ws://{host}/", f"blob:http://{host}/")
    return [u for u in urls if not u.startswith(ok) and u != f"http://{host}"]
