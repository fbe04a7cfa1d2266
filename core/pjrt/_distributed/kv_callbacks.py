"""The key-value callbacks a multi-process client hands its plugin.

``PJRT_Client_Create_Args`` carries three callbacks (put, blocking get and, since PJRT API 0.61,
try-get); a plugin builds its cross-process store only when all three are set. Here they are
cffi ``extern "Python"`` functions (declared in ``_native/kv_python.cdef``): static C entry
points that take the GIL, so the plugin may call them from any of its threads. Each client's
``user_arg`` is a cffi handle to a `KeyValueCallbacks`, which routes the calls to one
store under the client's key prefix.

Rules the plugin relies on, kept here:

* A Python exception never crosses into the plugin: a missing key is NOT_FOUND, a blocking
  get that runs out of time is DEADLINE_EXCEEDED, a ``KeyboardInterrupt`` (Ctrl-C while the
  plugin waits for another process) is CANCELLED, anything else is INTERNAL with the
  exception's text, each built with the ``callback_error`` the plugin passed in.
* An interrupt is not lost in the plugin's error: the callbacks keep it
  (`KeyValueCallbacks.interrupt`), and `KeyValueCallbacks.raise_interrupt` raises
  it again, with its type, once the call into the plugin has returned.
* A value handed back is malloc'd memory (``_native/kv.c``) that the plugin frees with the
  deleter we set, whenever it likes, without needing the interpreter.
* The callbacks and their store stay alive as long as the C client: the client's
  `ClientHandle` keeps the `KeyValueCallbacks` (``keep_alive``).
"""
from __future__ import annotations

import logging

from .._capi.native_runtime import programs_may_call_python
from .._pjrt_cffi import ffi, lib
from ..errors import ErrorCode
from ..kv_store import KeyValueStore

logger = logging.getLogger(__name__)

#: A blocking get with a negative timeout waits this long (the plugin asked for no limit).
_NO_LIMIT_SECONDS = 365 * 24 * 3600.0


class KeyValueCallbacks:
    """The three callbacks of one client, bound to ``store`` under ``prefix``.

    Attributes:
      store: where values go.
      prefix: prepended to every key the plugin uses, so that clients (the k-th client of a
        plugin in each process pairs with the k-th in the others) never mix their keys.
      user_arg: the ``void*`` to put in each ``kv_*_user_arg``.
      interrupt: the ``KeyboardInterrupt`` (or other exception that is not an ``Exception``,
        such as ``SystemExit`` from a signal handler) raised in a callback, or None. The
        plugin got a CANCELLED error in its place; whoever called into the plugin raises it
        with `raise_interrupt`.
    """

    def __init__(self, store: KeyValueStore, prefix: str):
        self.store = store
        self.prefix = prefix
        self.user_arg = ffi.new_handle(self)
        self.interrupt: BaseException | None = None

    def raise_interrupt(self) -> None:
        """Raise the interrupt a callback caught (once), if any: call it when the call into
        the plugin (``PJRT_Client_Create``) has returned, before turning its error into an
        exception, so that Ctrl-C stays a ``KeyboardInterrupt``."""
        interrupt, self.interrupt = self.interrupt, None
        if interrupt is not None:
            raise interrupt

    def fill(self, args) -> None:
        """Set the callbacks in ``PJRT_Client_Create_Args`` ``args`` (all three)."""
        programs_may_call_python()  # the plugin may call them from a program: see CallPlan
        args.kv_get_callback = lib.pjrt_kv_python_get
        args.kv_get_user_arg = self.user_arg
        args.kv_put_callback = lib.pjrt_kv_python_put
        args.kv_put_user_arg = self.user_arg
        args.kv_try_get_callback = lib.pjrt_kv_python_try_get
        args.kv_try_get_user_arg = self.user_arg

    def key(self, args) -> str:
        return self.prefix + ffi.unpack(args.key, args.key_size).decode("utf-8", "surrogateescape")

    def __repr__(self) -> str:
        return f"KeyValueCallbacks({self.store!r}, prefix={self.prefix!r})"


def _error(args, code: ErrorCode, message: str):
    data = message.encode("utf-8", "replace")
    return lib.pjrt_kv_error(args.callback_error, int(code), data, len(data))


def _hand_back(args, value: bytes):
    """Put a malloc'd copy of ``value`` in the callback's out fields."""
    copy = lib.pjrt_kv_value_copy(value, len(value))
    if copy == ffi.NULL:
        return _error(args, ErrorCode.RESOURCE_EXHAUSTED, "out of memory copying a value")
    args.value = copy
    args.value_size = len(value)
    args.value_deleter_callback = ffi.addressof(lib, "pjrt_kv_value_free")
    return ffi.NULL


def _internal(args, what: str, error: BaseException):
    if not isinstance(error, Exception):
        # Ctrl-C (or a signal handler's SystemExit) while the plugin waits: not a failure of
        # the store. The plugin is told to give up; the exception is kept to be raised again,
        # as it is, in the caller (it cannot cross the plugin's C frames).
        try:
            callbacks = ffi.from_handle(args.user_arg)
            if callbacks.interrupt is None:
                callbacks.interrupt = error
        except BaseException:  # noqa: BLE001 - a broken user_arg: nothing to keep it on
            pass
        return _error(args, ErrorCode.CANCELLED, f"key-value {what} interrupted: "
                                                 f"{type(error).__name__}")
    logger.warning("key-value %s failed: %r", what, error)
    return _error(args, ErrorCode.INTERNAL, f"key-value {what} failed: "
                                            f"{type(error).__name__}: {error}")


@ffi.def_extern()
def pjrt_kv_python_get(args):
    try:
        callbacks = ffi.from_handle(args.user_arg)
        key = callbacks.key(args)
        timeout = args.timeout_in_ms / 1000.0 if args.timeout_in_ms >= 0 else _NO_LIMIT_SECONDS
        try:
            value = callbacks.store.get(key, timeout)
        except TimeoutError as error:
            return _error(args, ErrorCode.DEADLINE_EXCEEDED, str(error))
        return _hand_back(args, value)
    except BaseException as error:  # noqa: BLE001 - nothing may cross into the plugin
        return _internal(args, "get", error)


@ffi.def_extern()
def pjrt_kv_python_try_get(args):
    try:
        callbacks = ffi.from_handle(args.user_arg)
        key = callbacks.key(args)
        value = callbacks.store.try_get(key)
        if value is None:
            return _error(args, ErrorCode.NOT_FOUND, f"key {key!r} not found")
        return _hand_back(args, value)
    except BaseException as error:  # noqa: BLE001
        return _internal(args, "try-get", error)


@ffi.def_extern()
def pjrt_kv_python_put(args):
    try:
        callbacks = ffi.from_handle(args.user_arg)
        callbacks.store.set(callbacks.key(args), ffi.unpack(args.value, args.value_size))
        return ffi.NULL
    except BaseException as error:  # noqa: BLE001
        return _internal(args, "put", error)
