"""Where a warning the package raises points: at the user's line, not inside the package.

A fixed ``stacklevel`` counts the frames between ``warnings.warn`` and the user's call, and
that count differs by path (a fit in-process or on a cluster, on arrays or on data the
workers read): "Training interrupted by user." named a line of ``estimator.py`` on every
cluster fit. Standard library only (Python 3.12's ``skip_file_prefixes`` does this).
"""

from __future__ import annotations

import os
import sys

__all__ = ["user_stacklevel"]

#: The package's folder: frames whose code lives under it are the package's own.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _inside(filename: str) -> bool:
    """Frames the user did not write: the package's, and scikit-learn's wrapper of ``fit``
    (``sklearn/base.py``'s ``_fit_context``), which stands between the user and ours."""
    return filename.startswith(PACKAGE_DIR) or filename.endswith(os.path.join("sklearn", "base.py"))


def user_stacklevel() -> int:
    """The ``stacklevel`` with which a ``warnings.warn`` in the calling function names the
    first frame outside the package (and scikit-learn's ``fit`` wrapper): the user's line.

    The frame of the outermost caller when every frame is the package's (a thread the
    package started).
    """
    level, frame = 1, sys._getframe(1)  # level 1: the function that warns
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level
