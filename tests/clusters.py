"""Settings the tests' in-process clusters share."""

from __future__ import annotations

#: No dashboard, and the scheduler's remaining HTTP endpoints on a free port: test runs
#: side by side must not collide.
FREE_PORTS = {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"}}
