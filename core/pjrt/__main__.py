"""``python -m pjrt``: the ``pjrt`` command (see [`pjrt.cli`][pjrt.cli])."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
