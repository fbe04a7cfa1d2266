"""What arrays and executables are made of, beneath the public ``Array`` and
``LoadedExecutable``: an array's reads to the host (``host_reads``, free functions over an
Array that its methods call), what a compiled program says about itself
(``executable_metadata``: the ``ExecutableMetadata`` an executable holds), what launches it
(``launcher``), whether a launch fits under the process's address-space limit
(``memory_headroom``, also asked before a client is made and a program compiled), its global
calls (``global_calls``), the numpy
arguments of one call (``numpy_arguments``), and the envelope of a serialized executable,
which names the plugin build that made it (``serialization``).

Import rule: modules here import each other, ``pjrt._capi``, ``pjrt._wire``, ``pjrt.errors``,
the value types below the array (``dtypes``, ``layouts``, ``hlo_sharding``, ``sharding``),
``pjrt.plugin``, ``pjrt.array`` and a trace's recorder (``pjrt._profiling``); never an
executable, the compiler or a client (they name a client only as ``pjrt.device.ClientView``).
Within that, each module keeps its rung of the ladder in docs/architecture.md ("The layers
below the client").
"""
