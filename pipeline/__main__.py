"""``python -m hmdspt``: the ``hmdspt`` command line (:func:`hmdspt.cli.main`)."""

import sys

from hmdspt.cli import main

if __name__ == "__main__":
    sys.exit(main())
