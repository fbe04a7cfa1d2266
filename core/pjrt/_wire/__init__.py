"""Wire formats read and written without a plugin: protobuf messages, device assignments, the
signature of an optimised HLO module and the MLIR bytecode container.

Import rule: modules here import only each other and ``pjrt.errors``/``pjrt.dtypes``; nothing
here loads a plugin or touches a C handle.
"""
