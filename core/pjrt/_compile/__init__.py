"""Compiling a program: the checks made before a plugin's compiler sees it, the pipeline from a
program and devices to a ``LoadedExecutable``, custom-call targets' set-up, the worker
process behind crash-isolated compilation, and how pjrt's helper processes (that worker,
``pjrt conform``'s) end with the process that started them (``parent_watch``).

Import rule: this is the top internal layer; it may import any public module and the other
private packages. Public modules reach it only from inside functions (``Client.compile_and_load``,
``pjrt.compile``), so that importing the core does not load the compiler.
"""
