"""The machinery beneath the public sharding types (``pjrt.hlo_sharding``, ``pjrt.sharding``):
XLA's sharding text and proto forms, tile assignments, and the annotations programs carry
(Shardy's ``sdy`` attributes and ``mhlo.sharding``).

Import rule: modules here import each other, ``pjrt._wire``, ``pjrt.errors`` and the public
sharding value types (``pjrt.hlo_sharding``, ``pjrt.mesh``); never a client or a C handle.
"""
