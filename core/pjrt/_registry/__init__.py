"""Beneath the public registry (``pjrt.registry``): what a backend registry knows before any
backend comes up (``registrations``: the registered factories and plugin libraries, the
platforms chosen) and how installed plugins are found (``discovery``: ``jax_plugins``
modules and entry points, ``PJRT_NAMES_AND_LIBRARY_PATHS``).

Import rule: modules here import each other, ``pjrt._loading``, ``pjrt.errors``, and the
public modules a registration makes backends with (``pjrt.client``, ``pjrt.plugin``,
``pjrt.topology``); never ``pjrt.registry`` itself, which builds on them.
"""
