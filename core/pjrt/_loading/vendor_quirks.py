"""Settings a vendor's library needs before it starts, applied by the library's identity.

Some plugin libraries read switches from the environment when they start, and their defaults
cost minutes on machines they were not built for. Such a switch belongs to the library, not to
the package that usually loads it: the same ``libtpu.so`` may come through pjrt-tpu, a JAX
wheel, or a ``PJRT_NAMES_AND_LIBRARY_PATHS`` entry under any name. So each quirk here is
matched against the library file itself (its resolved file name) and applied by
`prepare`, which [`pjrt.client.create_client`][pjrt.client.create_client] calls before the plugin is initialised,
whichever path loaded it. A value already in the environment is never changed.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import glob
import logging
import os
from typing import Callable

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Quirk:
    """Environment settings for one vendor library."""

    #: What the library is, for messages.
    name: str
    #: Shell patterns matched against the library's resolved file name.
    file_patterns: tuple[str, ...]
    #: Sets the environment switches; called before the library starts.
    apply: Callable[[], None]


# -- libtpu ----------------------------------------------------------------------------------

#: Device nodes of attached TPU chips: /dev/accel* (v2-v4, v5e, v6e), /dev/vfio/N (v5p).
TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")
#: Where Linux tells the machine's product name; "Google Compute Engine" on Google Cloud.
DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"


def _has_tpu_devices() -> bool:
    return any(glob.glob(pattern) for pattern in TPU_DEVICE_PATTERNS)


def _on_google_cloud() -> bool:
    try:
        with open(DMI_PRODUCT_NAME, encoding="utf-8", errors="replace") as f:
            return "google" in f.read().lower()
    except OSError:
        return False


def _libtpu_environment() -> None:
    """Off a TPU host libtpu's defaults only cost time or mislead: it asks the Google Cloud
    metadata server about its TPU, retrying each question for about 30 s (minutes in all),
    and takes /tmp/libtpu_lockfile, so every process after the first fails on the lock
    instead of saying there is no TPU. With no TPU attached, skip both (the metadata server
    only when the machine does not say it is a Google Cloud one)."""
    if _has_tpu_devices():
        return
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if "TPU_SKIP_MDS_QUERY" not in os.environ and not _on_google_cloud():
        logger.debug("no TPU attached and not on Google Cloud: setting TPU_SKIP_MDS_QUERY=1 "
                     "so that libtpu does not wait for the metadata server")
        os.environ["TPU_SKIP_MDS_QUERY"] = "1"


QUIRKS: list[Quirk] = [Quirk("libtpu", ("libtpu*.so*",), _libtpu_environment)]


def quirks_of(library_path: str | None) -> list[Quirk]:
    """The quirks whose library is the file at ``library_path`` (symbolic links followed)."""
    if not library_path:
        return []
    names = {os.path.basename(library_path), os.path.basename(os.path.realpath(library_path))}
    return [quirk for quirk in QUIRKS
            if any(fnmatch.fnmatch(name, pattern) for name in names
                   for pattern in quirk.file_patterns)]


def prepare(plugin) -> None:
    """Apply the quirks of ``plugin``'s library (a [`Plugin`][pjrt.plugin.Plugin]) before it
    starts; harmless to repeat."""
    for quirk in quirks_of(plugin.library_path):
        quirk.apply()
