"""The compile pipeline (compiler.py): program bytes, default compile options, the program's
signature, the check of static extents, and compilation on the real CPU plugins."""
from __future__ import annotations

import numpy as np
import pytest

import pjrt
from pjrt._compile import pipeline as compiler
from pjrt._compile import program_facts
from pjrt._compile.program_facts import read_program
from conftest import cpu_plugin_path, run_python
from fixtures import programs

TINY = programs.get("tiny_tanh")


def test_malformed_program_is_a_plugin_error_and_process_goes_on(client, tiny):
    with pytest.raises(pjrt.XlaRuntimeError) as info:
        client.compile_and_load("func.func @main( this is not mlir")
    assert info.value.code_name in ("INVALID_ARGUMENT", "UNKNOWN", "INTERNAL")
    outputs = tiny.execute([client.buffer_from_pyval(x) for x in TINY.inputs()])
    programs.check_outputs(TINY, [np.asarray(outputs[0])])


def test_program_of_wrong_type_is_type_error(client):
    with pytest.raises(TypeError, match="StableHLO"):
        client.compile_and_load(12345)


def test_shardy_program_gets_shardy_partitioner_by_default(client):
    """A Shardy program compiles without the caller naming the partitioner."""
    text = programs.get("spmd_elementwise_2d").read_text("shardy")
    assert program_facts.uses_shardy(text.encode())
    assert not program_facts.uses_shardy(programs.get("spmd_elementwise_2d").read_text("gspmd").encode())
    executable = client.compile_and_load(text, client.local_devices())
    assert executable.num_partitions() == 8


# -- program bytes and the signature ----------------------------------------------------------

def test_program_bytes_takes_text_and_bytecode():
    text = TINY.read_text()
    assert program_facts.program_bytes(text) == text.encode("utf-8")
    with open(programs.FIXTURES_DIR + "/" + programs.BYTECODE_FILE, "rb") as f:
        bytecode = f.read()
    for kind in (bytes, bytearray, memoryview):
        assert program_facts.program_bytes(kind(bytecode)) == bytecode
    with pytest.raises(TypeError, match="not list"):
        program_facts.program_bytes(["not", "a", "program"])


def test_read_signature_of_text_and_of_bytecode():
    signature = program_facts.read_signature(TINY.read_text().encode())
    assert signature.input_shardings == (None, None)
    assert signature.output_shardings == (None,)
    assert signature.result_shapes == ((8,),)
    spmd = programs.get("spmd_elementwise_2d")
    for variant in ("shardy", "gspmd"):
        signature = program_facts.read_signature(spmd.read_text(variant).encode())
        assert len(signature.input_shardings) == 1 and signature.input_shardings[0] is not None
        assert signature.result_shapes == ((8, 8),)
    with open(programs.FIXTURES_DIR + "/" + programs.BYTECODE_FILE, "rb") as f:
        assert program_facts.read_signature(f.read()) is None
    assert program_facts.read_signature(b"module { func.func private @helper() { return } }") is None


# -- default compile options ------------------------------------------------------------------

def test_default_options_for_one_device(client):
    device = client.devices()[3]
    options = compiler.default_compile_options([device], read_program(TINY.read_text()))
    build = options.executable_build_options
    assert (build.num_replicas, build.num_partitions) == (1, 1)
    assert not build.use_spmd_partitioning
    assert build.device_assignment.device_ids.tolist() == [[3]]
    # The options compile and run the program where they say.
    executable = client.compile_and_load(TINY.read_text(), compile_options=options)
    assert executable.local_devices() == [device]
    a, b = TINY.inputs()
    (out,) = executable.execute([client.buffer_from_pyval(a, device),
                                 client.buffer_from_pyval(b, device)])
    programs.check_outputs(TINY, [np.asarray(out)])


@pytest.mark.parametrize("variant", ["shardy", "gspmd"])
def test_default_options_for_an_spmd_program(client, variant):
    devices = client.devices()[::-1]
    text = programs.get("spmd_elementwise_2d").read_text(variant)
    options = compiler.default_compile_options(devices, read_program(text.encode()))
    build = options.executable_build_options
    assert (build.num_replicas, build.num_partitions) == (1, 8)
    assert build.use_spmd_partitioning
    assert build.use_shardy_partitioner == (variant == "shardy")
    assert build.device_assignment.device_ids.tolist() == [[d.id for d in devices]]
    # Every argument and result is annotated: nothing is left to the partitioner.
    assert not any(build.allow_spmd_sharding_propagation_to_parameters)
    assert not any(build.allow_spmd_sharding_propagation_to_output)


def test_default_options_let_the_partitioner_choose_unannotated_layouts(client):
    text = """func.func public @main(%x: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32> {mhlo.sharding = "{replicated}"}) {
      %0 = stablehlo.add %x, %y : tensor<8xf32>
      return %0, %0 : tensor<8xf32>, tensor<8xf32>
    }"""
    devices = client.devices()[:4]
    build = compiler.default_compile_options(devices, read_program(text.encode())).executable_build_options
    assert list(build.allow_spmd_sharding_propagation_to_parameters) == [False, True]
    assert list(build.allow_spmd_sharding_propagation_to_output) == [True, False]
    first, second = pjrt.compile(text, devices)(np.arange(8.0, dtype=np.float32),
                                                np.ones(8, np.float32))
    np.testing.assert_array_equal(np.asarray(first), np.arange(8.0) + 1)
    np.testing.assert_array_equal(np.asarray(second), np.arange(8.0) + 1)


def test_default_options_for_replicated_execution(client):
    devices = client.devices()[2:5]
    build = compiler.default_compile_options(devices, read_program(TINY.read_text()),
                                             replicated=True).executable_build_options
    assert (build.num_replicas, build.num_partitions) == (3, 1)
    assert build.device_assignment.device_ids.tolist() == [[2], [3], [4]]


# -- devices and given compile options --------------------------------------------------------

def test_devices_must_be_this_clients_and_distinct(client, make_client):
    other = make_client(2)
    with pytest.raises(ValueError, match="appears twice"):
        client.compile_and_load(TINY.read_text(), [client.devices()[0], client.devices()[0]])
    with pytest.raises(ValueError, match="is not a device of this cpu client"):
        client.compile_and_load(TINY.read_text(), [other.devices()[0]])


def test_given_options_must_match_the_device_count(client):
    options = pjrt.CompileOptions()
    options.executable_build_options.num_partitions = 2
    with pytest.raises(ValueError, match="1 replicas x 2 partitions but 3 devices"):
        client.compile_and_load(TINY.read_text(), client.devices()[:3], options)


def test_given_options_take_the_devices_given(client):
    """Options without a device assignment get one from the devices passed with them."""
    options = pjrt.CompileOptions()
    executable = client.compile_and_load(TINY.read_text(), [client.devices()[6]], options)
    assert executable.local_devices() == [client.devices()[6]]


# -- static extents ---------------------------------------------------------------------------

#: 2**62 float32 elements: 2**64 bytes, past what an int64 size can hold.
HUGE = "tensor<4611686018427387904xf32>"


@pytest.mark.parametrize("tensor, fits", [
    (HUGE, False),
    ("tensor<2305843009213693951xf32>", True),             # 2**63 - 4 bytes
    ("tensor<2305843009213693952xf32>", False),            # 2**63 bytes
    ("tensor<4x4611686018427387904xi8>", False),
    ("tensor<9223372036854775807xi1>", True),              # a byte per i1
    ("tensor<576460752303423488xcomplex<f64>>", False),    # 2**59 x 16 bytes
    ("tensor<?x4611686018427387904xf32>", True),           # dynamic: not a static type
    # No element, but the running product of the extents overflows: XLA refuses the shape
    # (and aborts the compile).
    ("tensor<4611686018427387904x4611686018427387904x0xf32>", False),
    ("tensor<3x2305843009213693952x0xf32>", False),        # 4 * 3 * 2**61 > 2**63 - 1
    ("tensor<3x2305843009213693952x0xi8>", True),          # 1 * 3 * 2**61 fits
    ("tensor<0x4611686018427387904x4611686018427387904xf32>", True),  # 0 first: stays 0
    ("tensor<4611686018427387904x0xf8E4M3FN>", True),      # a byte each
])
def test_check_static_extents(tensor, fits):
    program = f"func.func public @main(%x: {tensor}) -> {tensor} {{ return %x : {tensor} }}"
    if fits:
        compiler.check_static_extents(program.encode())
    else:
        with pytest.raises(ValueError, match=r"its extents overflow int64 at dimension \d.*"
                                             r"multiplied in order") as info:
            compiler.check_static_extents(program.encode())
        assert tensor.split(">")[0] in str(info.value)


def test_an_overflowing_extent_is_a_value_error_not_an_abort(cpu_plugin):
    """XLA aborts the process on such a shape; pjrt refuses it first. In a child process, so
    that a regression fails this test and not the whole run."""
    result = run_python(f"""
        import numpy as np, pjrt
        pjrt.load_pjrt_plugin_dynamically("cpu", {cpu_plugin_path(cpu_plugin.name)!r})
        client = pjrt.make_c_api_client("cpu")
        text = "func.func public @main(%x: {HUGE}) -> {HUGE} {{ return %x : {HUGE} }}"
        try:
            pjrt.compile(text, client.devices()[0])
        except ValueError as error:
            print("ValueError", error)
        program = pjrt.compile({TINY.read_text()!r}, client.devices()[0])
        print("still works", float(np.asarray(program(np.ones(8, np.float32), np.ones(8, np.float32)))[0]))
    """)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ValueError the program's tensor<4611686018427387904xf32>")
    assert "bytes > 2**63 - 1" in lines[0]
    assert lines[1].startswith("still works ")
    np.testing.assert_allclose(float(lines[1].split()[-1]), np.tanh(2.0), rtol=1e-6)


def test_devices_and_a_device_assignment_that_disagree_are_refused(client):
    from pjrt.compile_options import CompileOptions, DeviceAssignment

    options = CompileOptions()
    options.executable_build_options.device_assignment = DeviceAssignment.create([[1]])
    devices = client.devices()
    with pytest.raises(ValueError, match=r"executable_devices \(ids \[0\]\).*disagree"):
        client.compile_and_load(TINY.read_text(), [devices[0]], options)
    executable = client.compile_and_load(TINY.read_text(), [devices[1]], options)
    assert executable.local_devices() == [devices[1]]


# -- the program, read once -------------------------------------------------------------------

class _CountedText(str):
    """Program text that counts how often it is encoded to the bytes the plugin is given."""

    encodes = 0

    def encode(self, *args, **kwargs):
        type(self).encodes += 1
        return super().encode(*args, **kwargs)


@pytest.mark.parametrize("face", ["pjrt.compile", "Client.compile_and_load"])
def test_one_compile_reads_the_program_once(client, tmp_path, face):
    """pjrt.compile and Client.compile_and_load are two faces over one compile: the text is
    encoded once, and the checks, the options, the cache key and the PJRT_Program all use
    those bytes (a second compile of the same text then hits the cache entry they keyed)."""
    from pjrt import compilation_cache

    devices = client.devices()[:1]
    compilation_cache.set_compilation_cache_dir(tmp_path)
    try:
        for attempt in range(2):
            _CountedText.encodes = 0
            program = _CountedText(TINY.read_text())
            if face == "pjrt.compile":
                compiled = pjrt.compile(program, devices[0])
                outputs = [compiled(*TINY.inputs())]
            else:
                executable = client.compile_and_load(program, devices)
                outputs = executable.execute([client.buffer_from_pyval(x, devices[0])
                                              for x in TINY.inputs()])
            assert _CountedText.encodes == 1, attempt
            programs.check_outputs(TINY, [np.asarray(outputs[0])])
            assert len(compilation_cache.get_compilation_cache().entries()) == 1
    finally:
        compilation_cache.set_compilation_cache_dir(None)
        compilation_cache._explicit = compilation_cache._UNSET  # the environment decides again


def test_program_facts_of_text_and_of_bytecode():
    text = TINY.read_text()
    facts = read_program(text)
    assert facts == read_program(text.encode()) == read_program(bytearray(text.encode()))
    assert facts.code == text.encode() and facts.format == "mlir"
    assert not facts.is_bytecode and not facts.takes_platform_index and not facts.uses_shardy
    assert facts.result_shapes == ((8,),)
    assert facts.unannotated() == ([True, True], [True])
    assert facts.main_arguments.count(b"%") == 2
    assert str(len(facts.code)) in repr(facts) and "tanh" not in repr(facts)
    with open(programs.FIXTURES_DIR + "/" + programs.BYTECODE_FILE, "rb") as f:
        bytecode = read_program(f.read())
    assert bytecode.is_bytecode and bytecode.signature is None
    assert bytecode.result_shapes is None and bytecode.unannotated() == ([], [])
    shardy = read_program(programs.get("spmd_elementwise_2d").read_text("shardy"))
    assert shardy.uses_shardy and shardy.unannotated() == ([False], [False])
    with pytest.raises(TypeError, match="not int"):
        read_program(12345)


def test_platform_index_is_read_from_mains_first_argument():
    attribute = 'jax.global_constant = "_platform_index"'
    takes = read_program(f'module {{ func.func public @main(%i: tensor<i32> {{{attribute}}}, '
                         f'%x: tensor<2xf32>) -> tensor<2xf32> {{ return %x : tensor<2xf32> }} }}')
    assert takes.takes_platform_index
    second = read_program(f'module {{ func.func public @main(%x: tensor<2xf32>, %i: tensor<i32> '
                          f'{{{attribute}}}) -> tensor<2xf32> {{ return %x : tensor<2xf32> }} }}')
    assert not second.takes_platform_index
    assert program_facts.takes_platform_index(takes.code)
    assert not program_facts.takes_platform_index(second.code)


def test_program_argument_hands_the_plugin_the_facts_bytes():
    from pjrt._pjrt_cffi import ffi

    facts = read_program(TINY.read_text())
    struct, keepalive = compiler.program_argument(facts)
    assert ffi.unpack(struct.code, struct.code_size) == facts.code
    assert ffi.unpack(struct.format, struct.format_size) == b"mlir"
    assert struct.struct_size == ffi.sizeof("PJRT_Program")
    del keepalive
