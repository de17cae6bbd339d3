"""What a test needs from the machine, and what happens when it is missing.

A test that needs an optional part (root, a running SLURM, Debian's chromium, the peers'
venv) calls :func:`missing` with a reason that names what to install or start. On a
developer's machine the test is skipped with that reason; with ``HMDSPT_REQUIRE_ALL`` set
(``.ci/run`` sets it) it fails instead, so CI cannot skip a part silently.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ALL = "HMDSPT_REQUIRE_ALL"


def missing(reason: str) -> None:
    """Skip the calling test for ``reason``, or fail it when every part is required."""
    if os.environ.get(REQUIRE_ALL):
        pytest.fail(f"{reason} ({REQUIRE_ALL} is set: this part must be present)", pytrace=False)
    pytest.skip(reason)
