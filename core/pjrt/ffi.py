"""Custom calls: registering XLA FFI handlers with PJRT plugins.

A StableHLO program calls code outside XLA with ``stablehlo.custom_call @target(...)`` and
``api_version = 4`` (typed FFI). At compile time the plugin looks ``target`` up in its own
copy of XLA's FFI registry; [`register_custom_call_target`][pjrt.ffi.register_custom_call_target] puts handlers there through
the plugin's PJRT FFI extension (``PJRT_Extension_Type_FFI``, declared in
``pjrt_c_api_ffi_extension.h``).

A handler is either a C function (an ``XLA_FFI_Handler*``, see ``xla_ffi_c_api.h``) or a
Python callable, which this module wraps in a C callback that decodes the XLA call frame::

    def add_one(operands, results, attributes):
        results[0][...] = operands[0] + attributes["delta"]

    pjrt.register_custom_call_target("add_one", add_one, platform="cpu")

**When registrations reach a plugin.** As in JAX, a handler may be registered before or after
the backend comes up. Registrations are kept per platform and handed to every plugin known to
serve that platform, now and later. A plugin's platform is the name its clients report
(``PJRT_Client_PlatformName``, e.g. ``"cpu"``), which is only known once a client exists; so a
plugin is bound to a platform when its first client reports that name, or as soon as it is
loaded when the name it was loaded under is the platform's name (a plugin loaded as
``"cpu"``). ``"host"`` and ``"cpu"`` are the same platform, as in XLA. Code that knows a
plugin's platform earlier can call [`bind_plugin_platform`][pjrt.ffi.bind_plugin_platform] itself.

**Handler bundles and their state.** ``fn`` may also be a dict of XLA's execution stages,
``{"instantiate": ..., "prepare": ..., "initialize": ..., "execute": ...}`` (only ``execute``
is required), as jaxlib takes them. The PJRT FFI extension registers one handler per target,
the one XLA calls at each execution, so pjrt runs the other stages from inside that call:

* ``instantiate`` runs once per call site of an executable (a program calling the target
  twice has two), before its first execution rather than when the executable is made; what
  it makes is the call site's state, which XLA keeps in the call site's execution state and
  frees with the executable. A Python ``instantiate(attributes)`` returns any Python object,
  handed to ``execute(operands, results, attributes, state)``; a C one keeps its state
  itself (``XLA_FFI_State_Set``), with a type registered through
  [`register_custom_type_id`][pjrt.ffi.register_custom_type_id].
* ``prepare(attributes, state)`` and ``initialize(attributes, state)`` of a Python bundle run
  before each execution, in that order (``state`` is None without ``instantiate``). Those of
  a C bundle are accepted and never run, as in XLA's CPU runtime, which has no such stages
  and keeps no state for them (a C handler asking for one there would crash the plugin).

Each plugin library carries its own XLA, so registering with one plugin does not make a
handler known to another; and a plugin keeps a handler for the life of the process, so the
callbacks made here are never freed.
"""
from __future__ import annotations

import enum
import logging
import numbers
import threading
from typing import Any

from ._capi import api as _c
from ._capi import ffi_state as _state
from ._capi import python_api as _python_api
from ._capi.native_runtime import programs_may_call_python
from ._capi.ffi_handlers import (HANDLER_FFI_VERSION, INSTANCE_STATE_TYPE_ID,
                                 INSTANCE_STATE_TYPE_NAME, c_bundle_handler,
                                 instance_state_deleter, keep_object, python_handler)
from . import plugin as plugin_module
# cffi's FFI object, named apart from this module (XLA's custom calls, also called FFI).
from ._pjrt_cffi import ffi as cffi_ffi, lib
from .errors import UnsupportedFeatureError, XlaRuntimeError, check
# Deferred set-up of targets lives apart from the handler registry, so that the compile path
# reaches it without this module; it is part of this module's interface.
from ._compile.target_preparation import canonical_platform as _canonical_platform
from ._loading import library_code
from ._compile.target_preparation import prepare_targets, register_target_preparation

logger = logging.getLogger(__name__)

__all__ = [
    "CustomCallTargetTraits", "HANDLER_FFI_VERSION", "bind_plugin_platform", "custom_call_targets", "ffi_extension",
    "has_ffi_extension", "prepare_targets", "register_custom_call_target",
    "register_custom_type_id", "register_target_preparation", "register_custom_call_handler",
    "register_custom_call_partitioner", "register_custom_call_as_batch_partitionable",
]


# -- the PJRT FFI extension ------------------------------------------------------------------

_EXTENSION_NAMES = {value: name.replace("PJRT_Extension_Type_", "")
                    for name, value in cffi_ffi.typeof("PJRT_Extension_Type").relements.items()}
_REGISTER_HANDLER_END = (cffi_ffi.offsetof("PJRT_FFI_Extension", "register_handler")
                         + cffi_ffi.sizeof("void*"))
_TYPE_REGISTER_END = (cffi_ffi.offsetof("PJRT_FFI_Extension", "type_id_register")
                      + cffi_ffi.sizeof("void*"))


def _api_of(plugin_or_api) -> _c.Api:
    return plugin_or_api.api if isinstance(plugin_or_api, plugin_module.Plugin) else plugin_or_api


def has_ffi_extension(plugin_or_api) -> bool:
    """Whether a `Plugin` (or its ``Api``) offers handler registration."""
    extension = _c.find_extension(_api_of(plugin_or_api), lib.PJRT_Extension_Type_FFI)
    return extension is not None and extension.struct_size >= _REGISTER_HANDLER_END


def ffi_extension(plugin_or_api):
    """The plugin's ``PJRT_FFI_Extension*``.

    Raises:
      UnsupportedFeatureError: the plugin has no FFI extension, or one too old to register
        handlers; the message lists the extensions it does have.
    """
    return _extension_reaching(plugin_or_api, _REGISTER_HANDLER_END, "PJRT_FFI_Register_Handler",
                               "handler registration", "custom-call handlers")


def _type_extension(plugin_or_api):
    """The plugin's ``PJRT_FFI_Extension*``, for registering user types (its first function,
    which every version of the extension has)."""
    return _extension_reaching(plugin_or_api, _TYPE_REGISTER_END, "PJRT_FFI_TypeID_Register",
                               "type registration", "custom types")


def _extension_reaching(plugin_or_api, end: int, function: str, feature: str, things: str):
    api = _api_of(plugin_or_api)
    extension = _c.find_extension(api, lib.PJRT_Extension_Type_FFI)
    if extension is not None and extension.struct_size >= end:
        return cffi_ffi.cast("PJRT_FFI_Extension *", extension)
    present = [_EXTENSION_NAMES.get(int(e.type), f"unknown type {int(e.type)}")
               for e in _c.extensions(api)]
    offered = ", ".join(present) if present else "none"
    why = (f"its FFI extension predates {feature}" if extension is not None
           else "it does not offer the PJRT FFI extension")
    raise UnsupportedFeatureError(
        f"{function} (PJRT_Extension_Type_FFI)", api.plugin_name, api.version,
        _c.HEADER_VERSION,
        why=f"{why}, so {things} cannot be registered with it (extensions it offers: "
            f"{offered})")


# -- turning `fn` into a handler address -----------------------------------------------------

def _c_address(fn) -> int | None:
    """The address of a C function given as cffi pointer, int, PyCapsule or ctypes pointer;
    None when ``fn`` is none of these (then it is taken to be a Python callable)."""
    if isinstance(fn, bool):
        return None
    if isinstance(fn, numbers.Integral):
        return int(fn)
    if isinstance(fn, cffi_ffi.CData):
        return int(cffi_ffi.cast("uintptr_t", fn))
    if type(fn).__name__ == "PyCapsule":
        # Capsules from jaxlib and others carry a name; GetPointer must be given the same one.
        return _python_api.capsule_pointer(fn, _python_api.capsule_name(fn))
    return _python_api.ctypes_pointer_address(fn)


# -- the registry ----------------------------------------------------------------------------

class _Registration:
    __slots__ = ("name", "platform", "fn", "identity", "address", "traits", "keepalive",
                 "keeps_state")

    def __init__(self, name, platform, fn, identity, address, traits, keepalive, keeps_state):
        self.name = name
        self.platform = platform
        self.fn = fn
        #: What makes two registrations of ``name`` the same handler: the C address or Python
        #: callable of each stage (a bundle written out again is the same).
        self.identity = identity
        self.address = address
        self.traits = traits
        self.keepalive = keepalive
        #: Whether pjrt keeps its call sites' states (a bundle with ``instantiate``), whose
        #: type the plugin must know before running it.
        self.keeps_state = keeps_state


class _TypeRegistration:
    __slots__ = ("name", "platform", "type_id", "deleter", "keepalive")

    def __init__(self, name, platform, type_id, deleter, keepalive):
        self.name = name
        self.platform = platform
        self.type_id = type_id  # the address of the caller's XLA_FFI_TypeId
        self.deleter = deleter  # a void (*)(void *)
        self.keepalive = keepalive


_lock = threading.RLock()
#: canonical platform -> target name -> registration, in registration order.
_registrations: dict[str, dict[str, _Registration]] = {}
#: plugin -> canonical platforms it serves (only plugins with an FFI extension).
_plugin_platforms: dict[plugin_module.Plugin, set[str]] = {}
#: plugin -> (canonical platform, target name) -> handler address registered with it.
_applied: dict[plugin_module.Plugin, dict[tuple[str, str], int]] = {}
#: canonical platform -> type name -> user type registration, in registration order.
_type_registrations: dict[str, dict[str, _TypeRegistration]] = {}
#: plugin -> the (canonical platform, type name) registered with it.
_types_applied: dict[plugin_module.Plugin, set[tuple[str, str]]] = {}
#: The plugins that know pjrt's type of call-site states.
_knows_instance_state_type: set[plugin_module.Plugin] = set()
#: Every callback and handler object ever registered: a plugin keeps the pointers forever.
_keepalive: list = []


def _register_type_with_plugin(plugin: plugin_module.Plugin,
                               registration: _TypeRegistration) -> None:
    key = (registration.platform, registration.name)
    done = _types_applied.setdefault(plugin, set())
    if key in done:
        return
    type_id = cffi_ffi.cast("XLA_FFI_TypeId *", registration.type_id)
    # The first plugin assigns the id (unless the caller set one); every later plugin is given
    # the same, since the handlers read the one XLA_FFI_TypeId.
    type_id.type_id = _state.register_type(plugin.api, _type_extension(plugin),
                                           registration.name, int(type_id.type_id),
                                           registration.deleter)
    done.add(key)


def _may_call_python(fn) -> bool:
    """Whether a handler may call into Python as it runs, as far as can be told before it
    does: a Python callable, a ctypes or cffi function pointer (either may be a trampoline
    into Python), or an int address or PyCapsule whose address is not in a loaded library's
    code (`pjrt._loading.library_code`: a ctypes trampoline's address passed as an int). The
    forms C kernels ship in (jaxlib's capsules, the plugin packages' LAPACK kernels by
    address) are taken to be C."""
    stages = fn.values() if isinstance(fn, dict) else (fn,)
    for stage in stages:
        plain = ((isinstance(stage, numbers.Integral) and not isinstance(stage, bool))
                 or type(stage).__name__ == "PyCapsule")
        if not plain:
            return True
        address = _c_address(stage)
        if address is None or not library_code.holds(address):
            return True
    return False


def _register_with_plugin(plugin: plugin_module.Plugin, registration: _Registration) -> None:
    key = (registration.platform, registration.name)
    done = _applied.setdefault(plugin, {})
    if done.get(key) == registration.address:
        return
    extension = ffi_extension(plugin)
    if _may_call_python(registration.fn):
        # From now on no launch keeps the GIL, which a handler of a program in flight may need.
        programs_may_call_python()
    if registration.keeps_state and plugin not in _knows_instance_state_type:
        _state.register_type(plugin.api, extension, INSTANCE_STATE_TYPE_NAME,
                             INSTANCE_STATE_TYPE_ID, instance_state_deleter)
        _knows_instance_state_type.add(plugin)
    args = cffi_ffi.new("PJRT_FFI_Register_Handler_Args *")
    args.struct_size = _c.struct_size("PJRT_FFI_Register_Handler_Args")
    name = cffi_ffi.new("char[]", registration.name.encode("utf-8"))
    platform = cffi_ffi.new("char[]", registration.platform.encode("utf-8"))
    args.target_name = name
    args.target_name_size = len(registration.name.encode("utf-8"))
    args.handler = cffi_ffi.cast("void *", registration.address)
    args.platform_name = platform
    args.platform_name_size = len(registration.platform.encode("utf-8"))
    args.traits = registration.traits
    check(plugin.api, extension.register_handler(args))
    done[key] = registration.address


def bind_plugin_platform(plugin: plugin_module.Plugin, platform: str) -> None:
    """Record that ``plugin`` serves ``platform`` and register that platform's handlers with it.

    Called by pjrt when a plugin's first client reports its platform (and when a plugin is
    loaded under the platform's own name); call it yourself when you know a plugin's platform
    earlier. Binding again is harmless.

    Raises:
      UnsupportedFeatureError: handlers are registered for ``platform`` but the plugin has no
        FFI extension to take them (the message lists the extensions it has).
      XlaRuntimeError: the plugin refused a handler.
    """
    canonical = _canonical_platform(platform)
    with _lock:
        pending = list(_registrations.get(canonical, {}).values())
        pending_types = list(_type_registrations.get(canonical, {}).values())
        if not has_ffi_extension(plugin):
            if pending or pending_types:
                ffi_extension(plugin)  # raises, listing the plugin's extensions
            return
        _plugin_platforms.setdefault(plugin, set()).add(canonical)
        # Types first: a handler may need one the moment a program runs it.
        for type_registration in pending_types:
            _register_type_with_plugin(plugin, type_registration)
        for registration in pending:
            _register_with_plugin(plugin, registration)


class CustomCallTargetTraits(enum.IntFlag):
    """Traits of a custom-call handler (``XLA_FFI_Handler_Traits`` bits; jaxlib's enum)."""

    DEFAULT = 0
    #: The handler may be captured into a GPU command buffer (CUDA graph).
    COMMAND_BUFFER_COMPATIBLE = 1


def register_custom_call_target(name: str, fn, platform: str = "cpu", api_version: int = 1,
                                traits: int = CustomCallTargetTraits.DEFAULT) -> None:
    """Register ``fn`` as the handler of custom-call target ``name`` on ``platform``.

    The handler reaches every plugin already serving ``platform`` now, and every plugin found
    to serve it later (see the module docstring). Registering the same handler again is a
    no-op; registering a different one under a name already taken is an error, because XLA
    would silently keep the first.

    Args:
      name: the custom-call target, as written after ``stablehlo.custom_call @``.
      fn: a C ``XLA_FFI_Handler*`` (a cffi pointer, an int address, a PyCapsule, a ctypes
        function pointer), or a Python callable called as
        ``fn(operands, results, attributes)``: numpy views of the operand buffers (read-only)
        and of the result buffers (writable; valid only during the call), and the call's
        attributes as a dict of ints, floats, bools, strings, numpy arrays and nested dicts.
        It fills ``results`` in place or returns the result value(s); whatever it raises
        becomes an error of the program (an XlaRuntimeError when it runs). Python handlers see
        buffers in row-major order; leave out ``operand_layouts``/``result_layouts``.
        Python handlers run on the CPU platform only: an accelerator's plugin passes device
        memory, which the host cannot read. Or a bundle of XLA's stages,
        ``{"instantiate": ..., "prepare": ..., "initialize": ..., "execute": ...}``, all C
        handlers or all Python callables, where only ``execute`` is required; a Python
        bundle's ``instantiate(attributes)`` makes the state of each call site, which
        ``execute(operands, results, attributes, state)`` gets (see the module docstring for
        when each stage runs).
      platform: the platform name, e.g. ``"cpu"`` (``"host"`` is the same platform).
      api_version: 1 (typed XLA FFI, for ``api_version = 4`` custom calls), the only kind
        current PJRT plugins take.
      traits: ``XLA_FFI_Handler_Traits`` bits passed to the plugin.

    Raises:
      NotImplementedError: ``api_version`` is not 1.
      ValueError: ``name`` is registered on ``platform`` with another handler.
      TypeError: ``fn`` (or a stage of the bundle) is neither a C function pointer nor
        callable, or the bundle mixes C handlers and Python callables.
      ValueError: the bundle has a key that is not a stage, or no ``execute``; a handler
        pointer is NULL.
      ValueError: ``fn`` is a Python callable and ``platform`` is not the CPU platform.
      UnsupportedFeatureError, XlaRuntimeError: a plugin already serving ``platform`` cannot
        take the handler (the registration is kept for other plugins).
    """
    if api_version == 0:
        raise NotImplementedError(
            f"custom call {name!r}: api_version=0 is XLA's legacy custom-call ABI (an untyped "
            f"C function kept in the registry of the XLA linked into the host process); the "
            f"PJRT C API offers no way to register such a function with a plugin, which "
            f"carries its own XLA. Write the handler against XLA FFI and pass api_version=1")
    if api_version != 1:
        raise NotImplementedError(
            f"custom call {name!r}: api_version={api_version} is not supported; PJRT plugins "
            f"only take typed XLA FFI handlers (api_version=1)")
    if not isinstance(name, str) or not name:
        raise TypeError(f"custom call target name must be a non-empty string, not {name!r}")
    canonical = _canonical_platform(platform)
    stages = _stages_of(name, fn)
    addresses = _c_addresses(name, stages)
    if addresses is None and canonical != "cpu":
        # The trampoline hands the handler numpy views of the buffers' addresses; on an
        # accelerator those are device memory, and the first read would crash the process.
        raise ValueError(
            f"custom call {name!r}: a Python handler reads its operands and results as host "
            f"memory, which only the 'cpu' platform passes; on {platform!r} the plugin "
            f"passes device memory. Register a C handler (an XLA_FFI_Handler*) for "
            f"{platform!r}, or run this custom call in a program for the CPU backend")
    identity = tuple(stages.items()) if addresses is None else tuple(addresses.items())
    keeps_state = "instantiate" in stages
    with _lock:
        existing = _registrations.get(canonical, {}).get(name)
        if existing is not None:
            if existing.fn is fn or existing.identity == identity:
                return
            raise ValueError(f"custom call target {name!r} is already registered on platform "
                             f"{canonical!r} with another handler")
        if addresses is None:
            others = {stage: h for stage, h in stages.items() if stage != "execute"}
            keepalive = python_handler(name, stages["execute"], others)
            address = int(cffi_ffi.cast("uintptr_t", keepalive))
        elif keeps_state:
            keepalive = c_bundle_handler(name, addresses["instantiate"], addresses["execute"])
            address = int(cffi_ffi.cast("uintptr_t", keepalive))
        else:
            # The plugin calls the C execute handler itself; a C bundle's prepare and
            # initialize never run (see the module docstring).
            keepalive, address = None, addresses["execute"]
        registration = _Registration(name, canonical, fn, identity, address, int(traits),
                                     (keepalive, fn), keeps_state)
        _keepalive.append(registration.keepalive)
        _registrations.setdefault(canonical, {})[name] = registration
        _tell_handler(canonical, registration)
        errors = []
        for plugin, platforms in list(_plugin_platforms.items()):
            if canonical in platforms:
                try:
                    _register_with_plugin(plugin, registration)
                except XlaRuntimeError as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]


#: XLA's execution stages, in the order they run; the keys of a handler bundle.
_STAGES = ("instantiate", "prepare", "initialize", "execute")


def _stages_of(name: str, fn) -> dict[str, Any]:
    """``fn`` as its stages: ``{"execute": fn}`` for a single handler, a bundle's stages that
    are set (None is left out, as jaxlib does)."""
    if not isinstance(fn, dict):
        return {"execute": fn}
    unknown = sorted(repr(key) for key in fn if key not in _STAGES)
    if unknown:
        raise ValueError(f"custom call {name!r}: a handler bundle's keys are XLA's execution "
                         f"stages {', '.join(map(repr, _STAGES))}, not {', '.join(unknown)}")
    stages = {stage: fn[stage] for stage in _STAGES if fn.get(stage) is not None}
    if "execute" not in stages:
        raise ValueError(f"custom call {name!r}: a handler bundle needs an 'execute' handler "
                         f"(the other stages are optional); it has {sorted(stages) or 'none'}")
    return stages


def _c_addresses(name: str, stages: dict[str, Any]) -> dict[str, int] | None:
    """The address of each stage's C handler; None when every stage is a Python callable.

    Raises:
      TypeError: a stage is neither, or the bundle mixes the two kinds.
      ValueError: a C handler's address is NULL.
    """
    addresses = {stage: _c_address(handler) for stage, handler in stages.items()}
    for stage, handler in stages.items():
        if addresses[stage] is None and not callable(handler):
            what = "fn" if len(stages) == 1 else f"the {stage!r} handler of the bundle"
            raise TypeError(f"custom call {name!r}: {what} must be a C function pointer (cffi "
                            f"pointer, int address, PyCapsule or ctypes pointer) or a Python "
                            f"callable, not {type(handler).__name__}")
    c_stages = sorted(stage for stage, address in addresses.items() if address is not None)
    if not c_stages:
        return None
    if len(c_stages) != len(stages):
        python_stages = sorted(set(stages) - set(c_stages))
        raise TypeError(f"custom call {name!r}: a handler bundle is all C handlers or all "
                        f"Python callables; stages {c_stages} are C and {python_stages} Python")
    for stage, address in addresses.items():
        if address == 0:
            raise ValueError(f"custom call {name!r}: the {stage} handler pointer is NULL")
    return {stage: int(address) for stage, address in addresses.items() if address is not None}


def custom_call_targets(platform: str = "cpu") -> dict[str, Any]:
    """The targets registered through pjrt for ``platform``: name -> the ``fn`` given."""
    canonical = _canonical_platform(platform)
    with _lock:
        return {name: registration.fn
                for name, registration in _registrations.get(canonical, {}).items()}


def register_custom_type_id(type_name: str, type_id, platform: str = "cpu", *,
                            deleter=None) -> None:
    """Register a user type, which C handlers keep as their call sites' state, on ``platform``.

    jaxlib's function of the same name. ``type_id`` points to the ``XLA_FFI_TypeId`` the
    handlers read: when it holds 0, the first plugin serving ``platform`` assigns the id and
    pjrt writes it there; every other plugin, now or later (see the module docstring), is
    given that id. Registering the same type again is a no-op.

    Args:
      type_name: the type's unique name.
      type_id: the address of the ``XLA_FFI_TypeId``: a PyCapsule (what jaxlib takes), an
        int, a cffi pointer or a ctypes pointer.
      platform: the platform name, e.g. ``"cpu"`` (``"host"`` is the same platform).
      deleter: a C ``void (*)(void*)`` the plugin frees a state of this type with when its
        executable dies (same forms as ``type_id``). jaxlib takes none; without one the
        plugin leaves the objects to their handlers (the plugins refuse to hold a state
        whose type has no deleter, so pjrt gives them one that frees nothing).

    Raises:
      TypeError: ``type_name`` is not a non-empty string, or ``type_id``/``deleter`` is not
        an address.
      ValueError: ``type_id`` or ``deleter`` is NULL, or ``type_name`` is registered on
        ``platform`` at another address.
      UnsupportedFeatureError: a plugin serving ``platform`` has no FFI extension (the
        message lists the extensions it has).
      XlaRuntimeError: a plugin refused the type (its name has another id there).
    """
    if not isinstance(type_name, str) or not type_name:
        raise TypeError(f"custom type name must be a non-empty string, not {type_name!r}")
    address = _c_address(type_id)
    if address is None:
        raise TypeError(f"custom type {type_name!r}: type_id must be the address of an "
                        f"XLA_FFI_TypeId (a PyCapsule, an int, a cffi or ctypes pointer), not "
                        f"{type(type_id).__name__}")
    free = keep_object if deleter is None else _c_address(deleter)
    if free is None:
        raise TypeError(f"custom type {type_name!r}: deleter must be a C function pointer "
                        f"(a PyCapsule, an int, a cffi or ctypes pointer), not "
                        f"{type(deleter).__name__}")
    if address == 0 or (deleter is not None and free == 0):
        raise ValueError(f"custom type {type_name!r}: the "
                         f"{'type_id' if address == 0 else 'deleter'} pointer is NULL")
    canonical = _canonical_platform(platform)
    with _lock:
        existing = _type_registrations.get(canonical, {}).get(type_name)
        if existing is not None:
            if existing.type_id == address:
                return
            raise ValueError(f"custom type {type_name!r} is already registered on platform "
                             f"{canonical!r} with another XLA_FFI_TypeId")
        registration = _TypeRegistration(type_name, canonical, address,
                                         cffi_ffi.cast("void (*)(void *)", free),
                                         (type_id, deleter))
        _keepalive.append(registration.keepalive)
        _type_registrations.setdefault(canonical, {})[type_name] = registration
        errors: list[Exception] = []
        for plugin, platforms in list(_plugin_platforms.items()):
            if canonical in platforms:
                try:
                    _register_type_with_plugin(plugin, registration)
                except (UnsupportedFeatureError, XlaRuntimeError) as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]


# -- handlers of registrations ----------------------------------------------------------------

#: canonical platform -> the handler every target registered for it is also given.
_handlers: dict[str, Any] = {}


def register_custom_call_handler(platform: str, handler) -> None:
    """Give ``handler`` every custom-call target registered for ``platform``: those registered
    already, at once, and each one registered later, as it is (jaxlib's function).

    ``handler(name, fn, platform, api_version, traits)`` receives each registration of
    [`register_custom_call_target`][pjrt.ffi.register_custom_call_target] (``platform`` as its
    canonical name, e.g. ``"cpu"`` for ``"host"``; ``traits`` a `CustomCallTargetTraits`), in
    the order they were made, so that code registering targets elsewhere (a framework's own
    registry) sees every one whenever it starts. pjrt's own delivery to the plugins serving
    ``platform`` goes on as before. As in jaxlib, a second handler for a platform is ignored
    (logged at debug level), and an exception of the handler reaches the registering call.

    Raises:
      TypeError: ``handler`` is not callable.
    """
    if not callable(handler):
        raise TypeError(f"a custom-call handler must be callable, not {type(handler).__name__}")
    canonical = _canonical_platform(platform)
    with _lock:
        if canonical in _handlers:
            logger.debug("a custom-call handler for %r is registered already; %r is ignored",
                         canonical, handler)
            return
        _handlers[canonical] = handler
        for registration in list(_registrations.get(canonical, {}).values()):
            _tell_handler(canonical, registration)


def _tell_handler(canonical: str, registration: _Registration) -> None:
    """Hand a registration to the platform's handler, if it has one (under ``_lock``)."""
    handler = _handlers.get(canonical)
    if handler is not None:
        handler(registration.name, registration.fn, canonical, 1,
                CustomCallTargetTraits(registration.traits))


# -- custom-call partitioners (the PJRT custom partitioner extension) -------------------------

#: target name -> (byte-level Partitioner, can_side_effecting_have_replicated_sharding), for
#: every plugin that offers the extension, now and later (registered with c_api=None).
_partitioners: dict[str, tuple] = {}
#: target names registered as batch partitionable with c_api=None.
_batch_partitionable: list[str] = []


def _sharding_bytes(sharding, what: str) -> bytes:
    from .hlo_sharding import HloSharding

    if isinstance(sharding, HloSharding):
        return sharding.to_proto()
    if isinstance(sharding, (bytes, bytearray)):
        return bytes(sharding)
    if hasattr(sharding, "SerializeToString"):  # a protobuf OpSharding
        return sharding.SerializeToString()
    if hasattr(sharding, "to_proto"):  # jaxlib's HloSharding: its OpSharding
        return _sharding_bytes(sharding.to_proto(), what)
    raise TypeError(f"{what} must be an HloSharding (or a serialised OpSharding), not "
                    f"{type(sharding).__name__}")


def _byte_partitioner(name: str, prop_user_sharding, partition, infer_sharding_from_operands):
    """The user's callbacks, which take and return `Shape` and `HloSharding`, over the bytes
    the plugin passes (serialised ShapeProto and OpSharding)."""
    from ._capi.custom_partitioner import Partitioner
    from .hlo_sharding import HloSharding
    from .shapes import Shape

    def shardings(encoded):
        return [None if s is None else HloSharding.from_proto(s) for s in encoded]

    def on_partition(shapes, arg_shardings, result_shape, result_sharding, config):
        module, operand_shardings, sharding = partition(
            [Shape.from_proto(s) for s in shapes], shardings(arg_shardings),
            Shape.from_proto(result_shape), shardings([result_sharding])[0], config)
        return (module, [_sharding_bytes(s, "an operand sharding partition returned")
                         for s in operand_shardings],
                _sharding_bytes(sharding, "the result sharding partition returned"))

    def on_infer(shapes, arg_shardings, result_shape, config):
        sharding = infer_sharding_from_operands(
            [Shape.from_proto(s) for s in shapes], shardings(arg_shardings),
            Shape.from_proto(result_shape), config)
        return None if sharding is None else _sharding_bytes(
            sharding, "the sharding infer_sharding_from_operands returned")

    def on_propagate(user_sharding, result_shape, config):
        return _sharding_bytes(prop_user_sharding(HloSharding.from_proto(user_sharding),
                                                  Shape.from_proto(result_shape), config),
                               "the sharding prop_user_sharding returned")

    return Partitioner(name, on_partition, on_infer, on_propagate)


def _apply_partitioner(plugin: plugin_module.Plugin, name: str, entry: tuple) -> None:
    from ._capi import custom_partitioner

    extension = custom_partitioner.find_extension(plugin.api, plugin.name)
    callbacks = custom_partitioner.make_callbacks(entry[0], entry[1])
    custom_partitioner.register(plugin.api, extension, name, callbacks)


def _apply_batch_partitionable(plugin: plugin_module.Plugin, name: str) -> None:
    from ._capi import custom_partitioner

    extension = custom_partitioner.find_extension(plugin.api, plugin.name)
    custom_partitioner.register_batch_partitionable(plugin.api, extension, name)


def _loaded_plugins_with_partitioner_extension() -> list:
    from ._capi import custom_partitioner

    table = plugin_module.default_plugins
    return [table.get(n) for n in table.names()
            if custom_partitioner.has_extension(table.get(n).api)]


def register_custom_call_partitioner(name: str, prop_user_sharding, partition,
                                     infer_sharding_from_operands,
                                     can_side_effecting_have_replicated_sharding: bool = False,
                                     c_api=None) -> None:
    """Let Python decide how the SPMD partitioner splits custom call ``name`` (jaxlib's
    function), through the plugin's custom partitioner extension
    (``PJRT_Extension_Type_Custom_Partitioner``). The plugin calls, while it compiles:

    * ``infer_sharding_from_operands(arg_shapes, arg_shardings, result_shape, backend_config)``
      -> the result's `HloSharding`, or None;
    * ``prop_user_sharding(user_sharding, result_shape, backend_config)`` -> the sharding
      the call should have, given the one a user of its result wants;
    * ``partition(arg_shapes, arg_shardings, result_shape, result_sharding, backend_config)``
      -> ``(mlir_module, operand_shardings, result_sharding)``: the per-device computation
      (StableHLO text or bytecode) and the shardings it wants its operands in and gives its
      result.

    Shapes are `Shape`, shardings `HloSharding` (None for an operand without one),
    ``backend_config`` the call's bytes. An exception in a callback becomes the compile's
    error, naming the target and the callback.

    Args:
      c_api: the plugin to register with: a `Plugin`, or its ``PJRT_Api*`` (PyCapsule, int,
        cffi pointer). None registers with every loaded plugin that offers the extension and
        with each one loaded later (plugins without it are passed over).

    Raises:
      TypeError: a callback is not callable, or ``name`` is not a non-empty string.
      UnsupportedFeatureError: ``c_api`` names a plugin without the extension (XLA's CPU
        builds), naming the plugin and the extension.
      XlaRuntimeError: a plugin refused the registration.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"a custom-call target name must be a non-empty string, not {name!r}")
    for label, callback in (("prop_user_sharding", prop_user_sharding), ("partition", partition),
                            ("infer_sharding_from_operands", infer_sharding_from_operands)):
        if not callable(callback):
            raise TypeError(f"custom partitioner {name!r}: {label} must be callable, not "
                            f"{type(callback).__name__}")
    entry = (_byte_partitioner(name, prop_user_sharding, partition,
                               infer_sharding_from_operands),
             bool(can_side_effecting_have_replicated_sharding))
    if c_api is not None:
        _apply_partitioner(plugin_module.plugin_of_c_api(c_api), name, entry)
        return
    with _lock:
        _partitioners[name] = entry
        plugins = _loaded_plugins_with_partitioner_extension()
    for plugin in plugins:
        _apply_partitioner(plugin, name, entry)


def register_custom_call_as_batch_partitionable(target_name: str, c_api=None) -> None:
    """Mark custom call ``target_name`` as partitionable along its batch dimension, through
    the plugin's custom partitioner extension (jaxlib's function; ``c_api`` as in
    [`register_custom_call_partitioner`][pjrt.ffi.register_custom_call_partitioner]).

    Raises:
      TypeError: ``target_name`` is not a non-empty string.
      UnsupportedFeatureError: ``c_api`` names a plugin without the extension.
      XlaRuntimeError: the plugin refused.
    """
    if not isinstance(target_name, str) or not target_name:
        raise TypeError(f"a custom-call target name must be a non-empty string, not "
                        f"{target_name!r}")
    if c_api is not None:
        _apply_batch_partitionable(plugin_module.plugin_of_c_api(c_api), target_name)
        return
    with _lock:
        if target_name not in _batch_partitionable:
            _batch_partitionable.append(target_name)
        plugins = _loaded_plugins_with_partitioner_extension()
    for plugin in plugins:
        _apply_batch_partitionable(plugin, target_name)


def _partitioners_on_load(plugin: plugin_module.Plugin) -> None:
    from ._capi import custom_partitioner

    with _lock:
        pending = dict(_partitioners)
        batch = list(_batch_partitionable)
    if not (pending or batch) or not custom_partitioner.has_extension(plugin.api):
        return
    for name, entry in pending.items():
        try:
            _apply_partitioner(plugin, name, entry)
        except XlaRuntimeError as exc:
            logger.warning("plugin %r refused the custom partitioner %r: %s", plugin.name,
                           name, exc)
    for name in batch:
        try:
            _apply_batch_partitionable(plugin, name)
        except XlaRuntimeError as exc:
            logger.warning("plugin %r refused batch partitionable %r: %s", plugin.name,
                           name, exc)


# -- hooks into plugin loading and client creation --------------------------------------------

def _on_plugin_loaded(plugin: plugin_module.Plugin) -> None:
    canonical = _canonical_platform(plugin.name)
    with _lock:
        if canonical in _registrations or canonical in _type_registrations:
            bind_plugin_platform(plugin, canonical)
    _partitioners_on_load(plugin)


def _on_client_created(client) -> None:
    platform = getattr(client, "platform", "")
    if not platform:
        return
    with _lock:
        if _canonical_platform(platform) in _plugin_platforms.get(client.plugin, ()):
            return
        try:
            bind_plugin_platform(client.plugin, platform)
        except UnsupportedFeatureError as exc:
            logger.warning("custom-call handlers registered for %r cannot reach plugin %r: %s",
                           platform, client.plugin.name, exc)


plugin_module.plugin_load_hooks.append(_on_plugin_loaded)
plugin_module.client_created_hooks.append(_on_client_created)


def _catch_up() -> None:
    """Learn the platforms of clients made before this module was first imported (pjrt
    imports it only when custom calls are first used)."""
    from .client import live_clients

    for client in live_clients():
        _on_client_created(client)


_catch_up()
