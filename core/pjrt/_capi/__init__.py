"""The C boundary and the ownership of C handles.

Everything here speaks to a plugin's ``PJRT_Api`` table through the one cffi extension
(``pjrt._pjrt_cffi``): the table itself and its version negotiation (``api``), who owns each C
handle and when it may be freed (``handles``), waits and native calls Ctrl-C can interrupt
(``waits``; native calls on worker threads, ``off_thread``; a launch there, ``long_runs``), the
exit that never meets native work in flight (``exit_guard``), the device whose program runs a
custom-call handler (``handler_devices``), staging memory a plugin adopts (``staging``), the
DLPack structs (``dlpack_structs``) and ``PJRT_NamedValue`` option lists, with the checks
made before a plugin reads them (``options``).

Import rule: modules here import only each other, ``pjrt.errors``, ``pjrt.dtypes`` and the cffi
extension; what they need from a higher layer they are given as arguments.
"""
