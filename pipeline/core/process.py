"""Settings of the whole process that several holders share (pure: numpy and the standard
library).

In-process Dask workers share one interpreter with each other and with the driver, so a
setting such as the BLAS thread limit or numpy's transparent huge page advice belongs to
all of them at once: :class:`ProcessSetting` applies it for the first holder and gives the
process back what it had when the last lets go.
"""

from __future__ import annotations

import importlib
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "HUGE_PAGES",
    "ProcessSetting",
    "importing_the_main_script_in_a_child",
    "numpy_huge_page_advice",
    "numpy_huge_page_switch",
]


def importing_the_main_script_in_a_child() -> bool:
    """Whether this process is a spawned one still importing its parent's main script
    (as Python's ``spawn`` does in every child before it runs its target)."""
    # The flag multiprocessing's own check reads (spawn._check_not_importing_main).
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


class ProcessSetting:
    """A process-wide setting held by several holders at once.

    Parameters
    ----------
    apply : callable
        ``apply(value)`` applies the setting and returns what gives the process back the
        setting it replaced.
    """

    def __init__(self, apply: Callable[[Any], Callable[[], Any]]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._holders = 0
        self._restore: Callable[[], Any] | None = None

    def hold(self, value: Any) -> None:
        """Hold the setting; the first holder's ``value`` is the one applied."""
        with self._lock:
            if self._holders == 0:
                self._restore = self._apply(value)
            self._holders += 1

    def release(self) -> None:
        """Let go of it; the last holder gives the process its own setting back."""
        with self._lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0 and self._restore is not None:
                restore, self._restore = self._restore, None
                restore()


def numpy_huge_page_switch() -> Callable[[bool], bool] | None:
    """numpy's switch of its transparent huge page advice (``madvise(MADV_HUGEPAGE)`` on
    the arrays of 4 MiB and more it allocates; what ``NUMPY_MADVISE_HUGEPAGE`` sets at
    import): called with True or False, it returns the setting it replaced. None where
    this numpy has none."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2, numpy 1
        try:
            return importlib.import_module(module)._set_madvise_hugepage
        except (ImportError, AttributeError):
            continue
    return None


def numpy_huge_page_advice() -> bool | None:
    """Whether numpy asks for huge pages in this process now (read by setting it and
    setting it back); None where this numpy has no such switch."""
    switch = numpy_huge_page_switch()
    if switch is None:
        return None
    advice = switch(True)
    switch(advice)
    return advice


def _advise_huge_pages(enabled: bool) -> Callable[[], Any]:
    switch = numpy_huge_page_switch()
    if switch is None:
        return lambda: None
    before = switch(enabled)
    return lambda: switch(before)


#: numpy's huge page advice in this process, held by the workers' plugins
#: (docs/design.md, "Round loop": the kernel's compaction for huge pages stalled the workers
#: that received shards into fresh memory).
HUGE_PAGES = ProcessSetting(_advise_huge_pages)
