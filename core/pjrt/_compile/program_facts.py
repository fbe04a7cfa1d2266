"""What the compile path knows of a program, read once: `ProgramFacts`.

A program reaches the plugin through several hands: ``pjrt.compile`` asks whether its ``main``
takes a platform index, the pipeline checks it, chooses compile options from its sharding
annotations, keys the compilation cache with its bytes, builds the ``PJRT_Program`` and tells
the executable the result shapes ``main`` declares; ahead-of-time compiles
(`DeviceTopology.compile_to_bytes`) and the isolation worker build the same ``PJRT_Program``.
`read_program` reads all of that in one pass over the program, and every one of them takes
the value it returns, so no step encodes the text or scans ``main`` again.

Reading never refuses a program (only a value that is not a program, with ``TypeError``):
what is wrong with one is for the checks (`pjrt._compile.pipeline`,
`pjrt._compile.program_checks`) and the plugin to say.
"""
from __future__ import annotations

import dataclasses
import re

from .._sharding.program_text import ProgramSignature, parse_program_signature
from .._wire import mlir_bytecode

__all__ = ["ProgramFacts", "read_program", "program_bytes", "read_signature",
           "takes_platform_index", "uses_shardy", "PLATFORM_INDEX_ATTRIBUTE"]

#: ``PJRT_Program.format`` for StableHLO, text and bytecode alike.
MLIR_FORMAT = "mlir"

#: The attribute jax puts on ``main``'s first argument when a module was exported for several
#: platforms: that argument is the index of the running platform in the export's list.
PLATFORM_INDEX_ATTRIBUTE = b'jax.global_constant = "_platform_index"'
#: ``main``'s argument list in program text.
MAIN_ARGUMENTS = re.compile(
    rb"func\.func\s+public\s+@main\s*\((.*?)\)\s*(?:->|attributes\b|\{)", re.S)
#: How a text program starts (after white space); anything else is read as bytecode when
#: looking for the platform index.
_TEXT_START = re.compile(rb"\s*(?:module|#|func|//)")


def program_bytes(computation) -> bytes:
    """A program as bytes: MLIR text (``str``) encoded as UTF-8, or bytecode as it is."""
    if isinstance(computation, str):
        return computation.encode("utf-8")
    if isinstance(computation, (bytes, bytearray, memoryview)):
        return bytes(computation)
    raise TypeError(f"a program must be StableHLO text (str) or bytecode (bytes), not "
                    f"{type(computation).__name__}")


def uses_shardy(program: bytes) -> bool:
    """Whether a StableHLO program carries Shardy sharding annotations (``sdy`` dialect)."""
    return b"sdy.mesh" in program or b"sdy.sharding" in program


def read_signature(program: bytes) -> ProgramSignature | None:
    """The signature of a text program's ``main``; None for bytecode or no public main."""
    try:
        return parse_program_signature(program.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _takes_platform_index(program: bytes, main_arguments: bytes | None) -> bool:
    if _TEXT_START.match(program) is None:
        # Bytecode cannot be read without MLIR; jax names ``_platform_index`` only in such
        # modules (on ``main`` and the functions it calls), so the string's presence decides.
        return b"_platform_index" in program
    if main_arguments is None or b"%" not in main_arguments:
        return False
    return PLATFORM_INDEX_ATTRIBUTE in main_arguments.split(b"%")[1]


def takes_platform_index(program: bytes) -> bool:
    """Whether ``main`` takes a platform index first (a multi-platform ``jax.export``).

    Text: read from ``main``'s first argument. Bytecode: whether ``_platform_index`` occurs
    (see `ProgramFacts.takes_platform_index`).
    """
    match = MAIN_ARGUMENTS.search(program)
    return _takes_platform_index(program, match.group(1) if match else None)


@dataclasses.dataclass(frozen=True)
class ProgramFacts:
    """One program as the compile path sees it; made by `read_program`.

    The compile (`pjrt._compile.pipeline.compile_program`), its checks, its default compile
    options, the compilation cache's key, the ``PJRT_Program`` handed to the plugin (here, in
    ahead-of-time compiles and in the isolation worker) and the executable's declared result
    shapes are all taken from this one value.
    """

    #: The bytes the plugin is given: text encoded as UTF-8, or bytecode as it is.
    code: bytes = dataclasses.field(repr=False)
    #: ``PJRT_Program.format``: ``"mlir"`` (text and bytecode alike).
    format: str
    #: Whether ``code`` is MLIR bytecode (its container, not its operations, can be checked).
    is_bytecode: bool
    #: The text of ``main``'s argument list (between its parentheses), None when no
    #: ``func.func public @main`` was found.
    main_arguments: bytes | None = dataclasses.field(repr=False)
    #: What ``main`` declares (shardings of its arguments and results, shapes of its
    #: results); None for bytecode, or text whose ``main`` is missing or cannot be read.
    signature: ProgramSignature | None = dataclasses.field(repr=False)
    #: Whether ``main`` takes a platform index first (a module ``jax.export`` lowered for
    #: several platforms). Text: its first argument carries `PLATFORM_INDEX_ATTRIBUTE`.
    #: Bytecode cannot be read without MLIR; jax names ``_platform_index`` only in such
    #: modules, so the string's presence decides.
    takes_platform_index: bool

    @property
    def uses_shardy(self) -> bool:
        """Whether the program carries Shardy annotations (``sdy`` dialect)."""
        return uses_shardy(self.code)

    @property
    def result_shapes(self) -> tuple | None:
        """The shape each result of ``main`` declares (None where dynamic or not a tensor);
        None when the signature is unknown."""
        return self.signature.result_shapes if self.signature is not None else None

    def unannotated(self) -> tuple[list[bool], list[bool]]:
        """Per argument and per result of ``main``: whether it carries no sharding (both
        lists empty when the signature is unknown)."""
        signature = self.signature
        if signature is None:
            return [], []
        return ([s is None for s in signature.input_shardings],
                [s is None for s in signature.output_shardings])

    def __repr__(self) -> str:
        kind = "bytecode" if self.is_bytecode else "text"
        return (f"ProgramFacts({kind}, {len(self.code)} bytes, format={self.format!r}, "
                f"takes_platform_index={self.takes_platform_index})")


def read_program(computation) -> ProgramFacts:
    """Read a StableHLO program (text ``str``, or text or bytecode ``bytes``) once.

    Raises:
      TypeError: ``computation`` is neither text nor bytes.
    """
    code = program_bytes(computation)
    is_bytecode = mlir_bytecode.is_bytecode(code)
    match = MAIN_ARGUMENTS.search(code)
    main_arguments = match.group(1) if match is not None else None
    signature = None
    if not is_bytecode:  # (bytecode is never valid UTF-8: its magic holds 0xEF 0x52)
        try:
            text = computation if isinstance(computation, str) else code.decode("utf-8")
            signature = parse_program_signature(text)
        except (UnicodeDecodeError, ValueError):
            signature = None
    return ProgramFacts(code=code, format=MLIR_FORMAT, is_bytecode=is_bytecode,
                        main_arguments=main_arguments, signature=signature,
                        takes_platform_index=_takes_platform_index(code, main_arguments))
