"""Loading plugin libraries and bringing backends up: the ELF checks made before ``dlopen``,
the dependency search when ``dlopen`` fails, vendors' settings, platform names, and bounded
start-up, and how loud plugins are meanwhile (``plugin_logging``).

Import rule: modules here import each other, ``pjrt._capi`` and ``pjrt.errors``; the registry
and the plugin module call them, not the reverse.
"""
