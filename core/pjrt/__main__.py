"""``python -m pjrt``: the ``pjrt`` command (see [`pjrt._app.cli`][pjrt._app.cli])."""
import sys

from ._app.cli import main

if __name__ == "__main__":
    sys.exit(main())
