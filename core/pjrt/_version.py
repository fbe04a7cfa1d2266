"""pjrt's version, written in this one place.

``pjrt.__version__`` re-exports it; the modules that report or compare the version import it
from here, so that none of them imports the package face. ``core/pyproject.toml`` reads it at
build time (``[tool.setuptools.dynamic]`` with ``attr``: setuptools reads the assignment below
from the file, without importing pjrt).
"""

__version__ = "0.1.0"
