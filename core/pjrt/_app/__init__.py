"""pjrt's programs, built on the library like any user's code: the ``pjrt`` command
(``cli``, also ``python -m pjrt``), its demo (``demo``, with the StableHLO files of
``demo_programs/``) and ``pjrt conform``, the conformance checks for plugin vendors
(``conform``).

Import rule: this is the top layer; it may import any module of the core (never the package
face ``pjrt`` itself), and no module of the core imports it but ``pjrt.__main__``.
"""
