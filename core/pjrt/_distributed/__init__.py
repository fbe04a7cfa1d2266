"""Processes of one job: the key-value callbacks a multi-process client hands its plugin, the
options and checks that client creation adds, and ``pjrt launch``.

Import rule: modules here import ``pjrt._capi``, ``pjrt.errors`` and ``pjrt.kv_store``; the
public face is ``pjrt.distributed`` and ``pjrt.kv_store``.
"""
