"""XLA's CPU PJRT plugin, packaged for the pjrt host.

The plugin library itself comes from the ``xla-cpu-pjrt`` distribution; this package finds it
and, later, registers it with pjrt's backend registry.
"""
from __future__ import annotations

import importlib.util
import os

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "cpu"

_LIBRARY_MODULE = "xla_plugins.xla_cpu_pjrt"
_LIBRARY_FILE = "xla_cpu_pjrt.so"


def library_path() -> str:
    """Absolute path of XLA's CPU plugin library.

    Raises:
      FileNotFoundError: ``xla-cpu-pjrt`` is not installed, or its library is missing.
    """
    spec = importlib.util.find_spec(_LIBRARY_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("xla-cpu-pjrt is not installed; pip install xla-cpu-pjrt")
    for directory in spec.submodule_search_locations:
        candidate = os.path.join(directory, _LIBRARY_FILE)
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"xla-cpu-pjrt is installed but {_LIBRARY_FILE} is missing from "
                            f"{list(spec.submodule_search_locations)}; reinstall xla-cpu-pjrt")
