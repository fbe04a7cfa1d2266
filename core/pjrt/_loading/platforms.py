"""Platform names: the aliases users may write, and how ``PJRT_PLATFORMS`` is read.

Plain data and string handling, below the registry that uses it.
"""
from __future__ import annotations

from typing import Sequence

#: The environment variable listing the platforms to bring up, first = default.
PLATFORMS_ENV = "PJRT_PLATFORMS"
#: jax's variable for the same list, read when PLATFORMS_ENV is unset.
JAX_PLATFORMS_ENV = "JAX_PLATFORMS"

#: Platform aliases: a name users may write for a family of platforms.
PLATFORM_ALIASES: dict[str, tuple[str, ...]] = {"gpu": ("cuda", "rocm")}

#: Platforms whose plugins this project ships and tests; others warn once as experimental.
NON_EXPERIMENTAL_PLATFORMS = frozenset({"cpu", "cuda", "rocm", "tpu"})

#: The default-backend priority of each platform pjrt knows, as JAX ranks them (higher wins):
#: a GPU outranks the TPU, which outranks the CPU. The one table: plugin packages read theirs
#: from it (through ``pjrt.plugin_api``), and so do JAX plugin wheels pjrt registers.
PLATFORM_PRIORITIES: dict[str, int] = {"cuda": 500, "rocm": 500, "tpu": 300, "cpu": 0}
#: The priority of any other plugin library (a declaration or registration that gives none, a
#: library named in PJRT_NAMES_AND_LIBRARY_PATHS): above the TPU, below a GPU, as in JAX.
DEFAULT_PLUGIN_PRIORITY = 400


def expand_platform_alias(platform: str) -> list[str]:
    """``"gpu"`` -> ``["cuda", "rocm"]``; any other name -> ``[name]``."""
    return list(PLATFORM_ALIASES.get(platform, (platform,)))


def is_gpu(platform: str) -> bool:
    """Whether ``platform`` is a GPU platform (``cuda`` or ``rocm``)."""
    return platform in PLATFORM_ALIASES["gpu"]


def parse_platforms(value: str | Sequence[str] | None) -> list[str] | None:
    """A ``PJRT_PLATFORMS``-style value (``"cuda,cpu"`` or a list) as names, spelled as
    written (platform names are case-sensitive, as in jax: a backend registered as
    ``platform_A`` is selected as ``platform_A``); None when it names nothing."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip() for n in names if n and n.strip()]
    return names or None
