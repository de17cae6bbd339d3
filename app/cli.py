"""``hmdspt monitor RUNS_PATH [--port N] [--address A] [--show] [--basic-auth PW_OR_FILE]
[--cookie-secret S]``: serve the monitor.

``pipeline/cli.py`` wires the sub-command to :func:`monitor_main`; the app itself lives in
:mod:`app.monitor` and reads only run logs.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from pathlib import Path

__all__ = ["monitor_main"]


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address if address not in ("", "0.0.0.0") else "127.0.0.1", 0))
        return s.getsockname()[1]


def _origins(address: str, port: int) -> list[str]:
    """Hosts the page may be opened under (Bokeh checks the websocket's Origin)."""
    hosts = {address, "127.0.0.1", "localhost"}
    if address in ("", "0.0.0.0", "::"):
        # Listening on every interface: allow the machine's own names too.
        hosts |= {socket.gethostname(), socket.getfqdn()}
    return sorted(f"{h}:{port}" for h in hosts if h)


def monitor_main(
    path: str | os.PathLike,
    port: int = 0,
    address: str = "127.0.0.1",
    show: bool = False,
    basic_auth: str | None = None,
    cookie_secret: str | None = None,
) -> int:
    """Serve the monitor for a folder of run logs (or one log) until interrupted.

    Parameters
    ----------
    path : str or path-like
        A folder of ``*.jsonl`` run logs, or one log file. It need not hold logs yet (the
        page lists new ones as they appear), but it must exist.
    port : int, default=0
        TCP port; 0 picks a free one.
    address : str, default="127.0.0.1"
        Interface to listen on. The default serves this machine only; on a cluster's
        login node use an SSH tunnel rather than ``0.0.0.0``.
    show : bool, default=False
        Open the page in a web browser.
    basic_auth : str or None, default=None
        Ask for a password before serving the page (Panel's basic auth): a password, or
        the path of a file holding one ``user:password`` per line (or one password).
        Use it whenever ``address`` is not ``127.0.0.1``; see docs/security.md. Without
        TLS in front (an HTTPS reverse proxy or an SSH tunnel) the password travels in
        clear text.
    cookie_secret : str or None, default=None
        Secret that signs the login cookie. None with ``basic_auth`` draws a random one
        per start (logins then last until the monitor restarts).

    Returns
    -------
    status : int
        0 after a clean stop (Ctrl-C), 2 if ``path`` does not exist.
    """
    path = Path(path).expanduser()
    if not path.exists():
        print(f"hmdspt monitor: error: no run log or folder at {path}", file=sys.stderr)
        return 2
    # JS and CSS from this server, never a CDN: the page works offline and on clusters
    # without outside access. Set before Panel and Bokeh read their settings.
    os.environ["BOKEH_RESOURCES"] = "server"
    import panel as pn

    from app.monitor import served_page

    port = int(port) or _free_port(address)
    auth: dict[str, str] = {}
    if basic_auth:
        auth = {
            "basic_auth": str(basic_auth),
            "cookie_secret": cookie_secret or secrets.token_urlsafe(32),
        }
    elif cookie_secret:
        auth = {"cookie_secret": cookie_secret}
    if address not in ("127.0.0.1", "localhost", "::1") and not basic_auth:
        print(
            f"hmdspt monitor: warning: serving on {address or 'every interface'} without "
            "--basic-auth: anyone who can reach the port can read the run logs",
            file=sys.stderr,
        )
    print(f"HMDSPT monitor of {path}", flush=True)
    try:
        pn.serve(
            {"/": lambda: served_page(path)},
            port=port,
            address=address,
            websocket_origin=_origins(address, port),
            show=show,
            title="HMDSPT monitor",
            threaded=False,
            **auth,
        )
    except KeyboardInterrupt:
        pass
    return 0
