"""Google's TPU PJRT plugin (libtpu), packaged for the pjrt host.

The plugin is ``libtpu.so`` from the ``libtpu`` wheel, or the file named by TPU_LIBRARY_PATH.
The ``libtpu`` Python module is never imported: importing it sets TPU_LIBRARY_PATH in the
environment as a side effect.

Three things here go beyond loading the library:

* **Slow start-up warning.** On a multi-host TPU slice, client creation waits until every host
  has started; a program launched on one host only hangs there. The factory logs a warning
  when creating the client takes longer than `SLOW_INIT_WARNING_SECONDS`.
* **The metadata server.** libtpu asks the Google Cloud metadata server about the TPU it runs
  on, and off Google Cloud it retries each question for about 30 s, several questions in a row:
  minutes before failing. [`configure_environment`][pjrt_tpu.configure_environment] sets TPU_SKIP_MDS_QUERY=1 when this is
  plainly not a Google Cloud machine and no TPU is attached (see its docstring); a value the
  user set is never changed.
* **The lockfile.** libtpu takes /tmp/libtpu_lockfile when it initialises, so that two
  processes never drive the same chips; without chips it only makes every process after the
  first fail with ABORTED "...libtpu multi-process lockfile" instead of the real reason.
  [`configure_environment`][pjrt_tpu.configure_environment] sets ALLOW_MULTIPLE_LIBTPU_LOAD=1 when no TPU is attached.
* **Topologies without a TPU.** libtpu describes TPU slices it is not attached to (e.g.
  ``"v5e:2x2"``) once the plugin has been initialised (``PJRT_Plugin_Initialize``); asked
  before, it answers FAILED_PRECONDITION "No TPU platforms registered". pjrt's
  ``make_topology`` initialises the plugin first, so ``pjrt.make_pjrt_topology("tpu",
  "v5e:2x2")`` works on any machine with libtpu installed.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import threading

from pjrt import plugin_api

__version__ = "0.1.0"

#: The platform name the plugin is registered under.
PLATFORM = "tpu"

#: Default-backend priority: the platform's entry in pjrt's one table of priorities (a GPU
#: outranks the TPU, which outranks the CPU, as in JAX).
PRIORITY = plugin_api.PLATFORM_PRIORITIES[PLATFORM]

#: Names a libtpu.so to use instead of the one in the libtpu wheel.
LIBRARY_PATH_ENV = "TPU_LIBRARY_PATH"

#: libtpu's switch for skipping the Google Cloud metadata server.
SKIP_MDS_QUERY_ENV = "TPU_SKIP_MDS_QUERY"

#: libtpu's switch for letting several processes initialise it at once (it takes "1").
ALLOW_MULTIPLE_LOAD_ENV = "ALLOW_MULTIPLE_LIBTPU_LOAD"

#: Seconds client creation may take before a warning is logged. A module constant so that a
#: deployment (or a test) can change it: ``pjrt_tpu.SLOW_INIT_WARNING_SECONDS = 300``.
SLOW_INIT_WARNING_SECONDS = 60.0

#: Where Linux tells the machine's product name; "Google Compute Engine" on Google Cloud.
DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"

#: Device nodes of attached TPU chips: /dev/accel* (v2-v4, v5e, v6e), /dev/vfio/N (v5p).
TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")

_LIBRARY_FILE = "libtpu.so"

logger = logging.getLogger(__name__)


def library_path() -> str:
    """The libtpu.so to load: TPU_LIBRARY_PATH when set, else the libtpu wheel's.

    Raises:
      FileNotFoundError: TPU_LIBRARY_PATH names no file (the message says so and how to fix
        it), or libtpu is not installed.
    """
    override = os.environ.get(LIBRARY_PATH_ENV, "").strip()
    if override:
        if not os.path.isfile(override):
            what = "a directory" if os.path.isdir(override) else "no file"
            raise FileNotFoundError(
                f"{LIBRARY_PATH_ENV}={override!r} names {what}; point it at a libtpu.so, or "
                f"unset it to use the library from the libtpu package")
        return os.path.abspath(override)
    try:
        spec = importlib.util.find_spec("libtpu")
    except ImportError:
        spec = None
    for directory in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(directory, _LIBRARY_FILE)
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"libtpu is not installed (or has no {_LIBRARY_FILE}); pip install "
                            f"libtpu, or set {LIBRARY_PATH_ENV} to a libtpu.so")


def has_tpu_devices() -> bool:
    """Whether TPU chips are attached to this machine (their device nodes exist)."""
    return any(glob.glob(pattern) for pattern in TPU_DEVICE_PATTERNS)


def on_google_cloud() -> bool | None:
    """Whether this is a Google Cloud machine, from its DMI product name.

    Returns None when the product name cannot be read (some containers hide it).
    """
    try:
        with open(DMI_PRODUCT_NAME, encoding="utf-8", errors="replace") as f:
            return "google" in f.read().lower()
    except OSError:
        return None


def configure_environment() -> None:
    """Set libtpu's environment switches where their defaults only cost time or mislead.

    * TPU_SKIP_MDS_QUERY=1 when no TPU is attached and the machine does not say it is a Google
      Cloud one (or does not say at all, as in many containers): there is no metadata server
      to ask, and with no TPU nothing it could answer would change the outcome. On Google
      Cloud, or with a TPU attached, the metadata server is how libtpu learns the slice's
      shape and its other hosts, so it is left alone.
    * ALLOW_MULTIPLE_LIBTPU_LOAD=1 when no TPU is attached: the lockfile guards chips, and
      without any, a second process would fail on the lock rather than say there is no TPU.

    A value already in the environment is never changed.
    """
    if has_tpu_devices():
        return
    if ALLOW_MULTIPLE_LOAD_ENV not in os.environ:
        os.environ[ALLOW_MULTIPLE_LOAD_ENV] = "1"
    if SKIP_MDS_QUERY_ENV not in os.environ and not on_google_cloud():
        logger.debug("no TPU attached and not on Google Cloud: setting %s=1 so libtpu does not "
                     "wait for the metadata server", SKIP_MDS_QUERY_ENV)
        os.environ[SKIP_MDS_QUERY_ENV] = "1"


def client_options() -> dict:
    """Create options for a TPU client: none; libtpu reads its settings from the environment."""
    return {}


def _warn_slow(seconds: float) -> None:
    logger.warning("creating the TPU client has taken more than %g seconds. On a multi-host TPU "
                   "slice every host must run this program before any of them can start; off "
                   "Google Cloud, set %s=1 so that libtpu does not wait for the metadata server.",
                   seconds, SKIP_MDS_QUERY_ENV)


def make_client(plugin, options: dict | None = None):
    """Create a client of the loaded libtpu ``plugin``, warning if that is slow.

    A timer started around the plugin's initialisation and client creation logs a warning
    after `SLOW_INIT_WARNING_SECONDS` (read at each call); it is cancelled as soon as
    the plugin answers, either way.

    Raises:
      XlaRuntimeError: libtpu refused, e.g. NOT_FOUND "TPU initialization failed" without a TPU.
    """
    configure_environment()
    seconds = SLOW_INIT_WARNING_SECONDS
    timer = threading.Timer(seconds, _warn_slow, args=(seconds,))
    timer.daemon = True  # never keep the process alive for a warning
    timer.start()
    try:
        return plugin_api.create_client(plugin, client_options() if options is None else options)
    finally:
        timer.cancel()
        timer.join()  # it wakes at once when cancelled; leave no thread behind


def make_topology(topology_name: str = "", *, plugin=None, **options):
    """A description of a TPU slice, e.g. ``"v5e:2x2"``, for compiling without a TPU.

    Topology names are ``<generation>:<shape>``, such as ``v4:2x2x1``, ``v5e:2x2``,
    ``v5p:2x2x1`` or ``v6e:2x2``; ``""`` describes the attached TPU (a default v2 slice when
    none is attached). The plugin is initialised first, which libtpu requires.

    Args:
      topology_name: the slice to describe.
      plugin: the loaded libtpu plugin; when None, libtpu is loaded into pjrt's default
        plugin table as ``"tpu"``.
      options: topology create options, passed to libtpu.

    Raises:
      XlaRuntimeError: INVALID_ARGUMENT for a name libtpu does not understand.
    """
    if plugin is None:
        plugin = plugin_api.load_plugin(PLATFORM, library_path())
    configure_environment()
    return plugin_api.make_topology(plugin, topology_name, options)


#: The plugin, as pjrt discovers it: the client made with the slow-start warning, topologies
#: described once the plugin is initialised. JAX loads libtpu itself, so under JAX this
#: package stays out of the way.
PLUGIN = plugin_api.PluginDeclaration(
    PLATFORM, library=library_path, priority=PRIORITY, options=client_options,
    make_client=make_client,
    make_topology=lambda plugin, topology_name, options: make_topology(
        topology_name, plugin=plugin, **options),
    version=__version__, serve_jax=False)


def initialize() -> None:
    """Register libtpu with pjrt's registry when pjrt's discovery calls this.

    Both pjrt and JAX call it through the ``jax_plugins`` entry point; under JAX it does
    nothing. The library is loaded now (no TPU needed); the client is created with the
    slow-start warning, and topologies can be described whether or not PJRT_PLATFORMS names
    tpu. A missing library (a wrong TPU_LIBRARY_PATH) is registered as the backend's failure,
    so ``pjrt.backend_errors()["tpu"]`` says what is wrong.
    """
    PLUGIN.initialize()
