"""Beneath ``pjrt.profiler``: what a trace records of pjrt's own work (``recorder``, which the
hooks in the array, executable and compile layers call), the plugins' own profilers over the
PJRT profiler extension (``plugin_profilers``), the XSpace bytes they hand back (``xspace``),
the files a trace leaves (``trace_file``), and the events' facts made JSON (``facts``).

Import rule: modules here import each other, ``pjrt._capi``, ``pjrt._wire`` and
``pjrt.errors``. ``recorder`` imports nothing of pjrt but ``facts``, which imports nothing of
pjrt, so that any layer may call it, and this file imports nothing either (importing
``recorder`` loads it).
"""
