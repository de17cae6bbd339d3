"""``hmdspt monitor RUNS_PATH [--port N] [--address A] [--show] [--basic-auth PW_OR_FILE]
[--cookie-secret S]``: serve the monitor.

``pipeline/cli.py`` wires the sub-command to :func:`monitor_main`; the app itself lives in
:mod:`hmdspt.app.monitor` and reads only run logs.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["monitor_main", "read_password_file"]


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


def read_password_file(path: str | os.PathLike) -> dict[str, str]:
    """The users of a ``--basic-auth`` file: one ``user:password`` per line.

    The password is everything after the first colon (it may hold colons and spaces);
    surrounding white space, blank lines and lines starting with ``#`` are ignored.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    users : dict
        User name to password.

    Raises
    ------
    ValueError
        Naming the first problem (the line number, never its text: it holds a password):
        not UTF-8, a line without a colon, an empty user name or password, a user twice,
        no user at all.
    OSError
        If the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, colon, password = line.partition(":")
        user, password = user.strip(), password.strip()
        if not colon:
            raise ValueError(f"line {number} is not user:password")
        if not user:
            raise ValueError(f"line {number} has an empty user name")
        if not password:
            raise ValueError(f"line {number} has an empty password")
        if user in users:
            raise ValueError(f"line {number} repeats the user {user}")
        users[user] = password
    if not users:
        raise ValueError("no user:password line")
    return users


def _basic_auth(value: str) -> str | dict[str, str]:
    """What Panel's basic auth takes: a password (any user name), or user -> password.

    Panel reads a file it is given as JSON; the documented file of ``user:password``
    lines is read here instead and passed as a dict, so the passwords stay in memory.
    """
    path = Path(value).expanduser()
    if path.is_file():
        users = read_password_file(path)
        if path.stat().st_mode & 0o077:
            print(
                f"hmdspt monitor: warning: {path} is readable by other users (chmod 600 {path})",
                file=sys.stderr,
            )
        return users
    if "/" in value or os.sep in value or value.startswith("~") or path.exists():
        # Meant as a file: never serve with its name as the password. The value is not
        # echoed: it might be a password after all.
        raise ValueError(
            "no password file at that path (a value with a / names a file; a password "
            "given directly cannot contain one)"
        )
    return value


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
        A folder of ``*.jsonl`` run logs (its subfolders' too, e.g. ``runs/compare/``),
        or one log file. It need not hold logs yet (the page lists new ones as they
        appear), but it must exist.
    port : int, default=0
        TCP port; 0 picks a free one.
    address : str, default="127.0.0.1"
        Interface to listen on. The default serves this machine only; on a cluster's
        login node use an SSH tunnel rather than ``0.0.0.0``.
    show : bool, default=False
        Open the page in a web browser.
    basic_auth : str or None, default=None
        Ask for a login before serving the page (Panel's basic auth): the path of a file
        of ``user:password`` lines (:func:`read_password_file`; only those users, each
        with its password, get in), or else a password, which any user name gets in with.
        A value with a ``/`` must be an existing file. Use it whenever ``address`` is not
        ``127.0.0.1``; see docs/security.md. Without TLS in front (an HTTPS reverse proxy
        or an SSH tunnel) the password travels in clear text.
    cookie_secret : str or None, default=None
        Secret that signs the login cookie. None with ``basic_auth`` draws a random one
        per start (logins then last until the monitor restarts).

    Returns
    -------
    status : int
        0 after a clean stop (Ctrl-C); 1, a runtime error as the CLI's (one line on
        stderr), if ``path`` does not exist or is a file but not a ``.jsonl`` one, or the
        ``basic_auth`` file is missing or malformed.
    """
    path = Path(path).expanduser()
    if not path.exists():
        print(f"hmdspt monitor: error: no run log or folder at {path}", file=sys.stderr)
        return 1
    if path.is_file() and path.suffix != ".jsonl":  # run logs are always .jsonl
        print(
            f"hmdspt monitor: error: {path} is not a run log (a .jsonl file) or a folder of them",
            file=sys.stderr,
        )
        return 1
    users: str | dict[str, str] | None = None
    if basic_auth:
        try:
            users = _basic_auth(str(basic_auth))
        except (ValueError, OSError) as exc:
            file = Path(str(basic_auth)).expanduser()
            where = f" {file}" if file.is_file() and str(file) not in str(exc) else ""
            print(f"hmdspt monitor: error: --basic-auth{where}: {exc}", file=sys.stderr)
            return 1
    # JS and CSS from this server, never a CDN: the page works offline and on clusters
    # without outside access. Set before Panel and Bokeh read their settings.
    os.environ["BOKEH_RESOURCES"] = "server"
    import panel as pn

    from hmdspt.app.monitor import served_page

    try:
        port = int(port) or _free_port(address)
    except OSError as exc:  # an address of no interface here
        return _cannot_listen(address, None, exc)
    auth: dict[str, Any] = {}
    if users:
        auth = {
            "basic_auth": users,  # Panel checks a dict as user -> password
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
    except OSError as exc:
        if exc.errno not in _BIND_ERRORS:
            raise
        return _cannot_listen(address, port, exc)
    return 0


# What binding a listening socket can fail with: the port taken, an address of no interface
# here, a port below 1024 for a user who may not have it.
_BIND_ERRORS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def _cannot_listen(address: str, port: int | None, exc: OSError) -> int:
    """Say in one line that the monitor cannot listen where it was asked; the exit code."""
    where = address if port is None else f"{address}:{port}"
    reason = exc.strerror or str(exc)
    print(f"hmdspt monitor: error: cannot listen on {where}: {reason}", file=sys.stderr)
    return 1
