"""A missing optional part skips its tests on a developer's machine and fails them in CI."""

from __future__ import annotations

import pytest

from tests.requires import REQUIRE_ALL, missing


def test_a_missing_part_skips_naming_what_to_install(monkeypatch):
    monkeypatch.delenv(REQUIRE_ALL, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        missing("needs apt-get install chromium")


def test_a_missing_part_fails_when_every_part_is_required(monkeypatch):
    monkeypatch.setenv(REQUIRE_ALL, "1")
    with pytest.raises(pytest.fail.Exception, match="needs a running SLURM.*must be present"):
        missing("needs a running SLURM")
