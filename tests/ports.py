"""TCP ports for the servers the tests start (the monitor, ``panel serve``)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default when the kernel's setting cannot be read.
_DEFAULT_EPHEMERAL_LOW = 32768


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for a bind to port 0."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range.

    A port the kernel gives for port 0 is ephemeral, and a Dask cluster of another test
    process may be given the same one before the server binds it: a CI-like run once sent
    the monitor's first request to a Dask server.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port found on 127.0.0.1 below {low}")
