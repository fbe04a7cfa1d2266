"""Loading plugin libraries and bringing backends up: the ELF checks made before ``dlopen``,
the dependency search when ``dlopen`` fails, vendors' settings, platform names, and bounded
start-up.

Import rule: modules here import each other, ``pjrt._capi``, ``pjrt.errors`` and
``pjrt.plugin_logging``; the registry and the plugin module call them, not the reverse.
"""
