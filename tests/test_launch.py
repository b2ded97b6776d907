"""attention.kernels.launch: which calls of a KernelLaunch go through Triton and which launch directly.

A fake JIT function stands in for Triton (no GPU here): it records calls through Triton's path
(``fn[grid](...)``, compiling when needed) and returns a fake compiled kernel whose launcher records
direct launches. The real kernels go through KernelLaunch in the GPU suite. The last test asks
Triton's own argument binder that ``tensor_key`` keeps everything it specializes a tensor on.
"""

from __future__ import annotations

import pytest
import torch
import triton.language as tl

from attention.kernels import launch
from tests.fake_device import FakeCurrentDevice


class FakeCompiled:
    packed_metadata = ("metadata",)
    function = 1234

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def run(self, *args):
        self.launches.append(args)


class FakeJit:
    arg_names = ["x", "y", "n", "scale", "BLOCK", "FLAG"]

    def __init__(self, compiled: FakeCompiled | None, error: Exception | None = None) -> None:
        self.through_triton: list[tuple] = []
        self.compiled = compiled
        self.error = error
        """Raised by each run (a kernel as Triton's interpreter fails it)."""

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.through_triton.append((grid, args, kwargs))
            if self.error is not None:
                raise self.error
            return self.compiled
        return run


@pytest.fixture
def stream(monkeypatch):
    monkeypatch.setattr(launch, "_raw_stream", lambda device: 77)
    monkeypatch.setattr(launch, "_current_device", lambda: None)   # CPU tensors: no CUDA device to make current
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", True)


def _launch(fake: FakeJit) -> launch.KernelLaunch:
    return launch.KernelLaunch(fake, (4, 2), scalars=(32, 0.5), constexprs={"FLAG": True, "BLOCK": 16},
                               options={"num_warps": 4, "maxnreg": None})


def test_first_call_goes_through_triton_the_next_ones_launch_directly(stream):
    fake = FakeJit(FakeCompiled())
    kernel_launch = _launch(fake)
    x, y = torch.zeros(8), torch.ones(8)
    kernel_launch(x, y)
    assert fake.through_triton == [((4, 2, 1), (x, y, 32, 0.5), {"FLAG": True, "BLOCK": 16, "num_warps": 4})]
    assert fake.compiled.launches == []
    x2, y2 = torch.zeros(8), torch.ones(8)
    kernel_launch(x2, y2)
    kernel_launch(y2, x2)
    assert len(fake.through_triton) == 1
    # grid, stream, function, metadata, three hooks' slots, then every argument in signature order (tensors as
    # addresses)
    assert fake.compiled.launches == [
        (4, 2, 1, 77, 1234, ("metadata",), None, None, None, x2.data_ptr(), y2.data_ptr(), 32, 0.5, 16, True),
        (4, 2, 1, 77, 1234, ("metadata",), None, None, None, y2.data_ptr(), x2.data_ptr(), 32, 0.5, 16, True),
    ]


def test_interpreter_and_switched_off_always_go_through_triton(stream, monkeypatch):
    interpreted = FakeJit(None)  # the interpreter returns no compiled kernel
    for _ in range(3):
        _launch(interpreted)(torch.zeros(8), torch.zeros(8))
    assert len(interpreted.through_triton) == 3
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", False)
    fake = FakeJit(FakeCompiled())
    kernel_launch = _launch(fake)
    for _ in range(3):
        kernel_launch(torch.zeros(8), torch.zeros(8))
    assert len(fake.through_triton) == 3 and fake.compiled.launches == []


@pytest.mark.parametrize("value, direct", [("0", "False"), ("", "True"), ("off", None)])
def test_the_fast_launch_switch_is_read_at_import_as_0_or_1(value, direct):
    """ATTN_TRITON_FAST_LAUNCH: 0 or 1, empty as unset; another value ("off" would read as on) stops the import,
    naming it."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", "from attention.kernels import launch; print(launch.DIRECT_LAUNCH)"],
                            env={**os.environ, "ATTN_TRITON_FAST_LAUNCH": value}, capture_output=True, text=True)
    if direct is None:
        assert result.returncode != 0 and "ATTN_TRITON_FAST_LAUNCH must be 0 or 1" in result.stderr
    else:
        assert result.returncode == 0 and result.stdout.strip() == direct, result.stderr


def test_launch_hooks_send_calls_through_triton(stream, monkeypatch):
    from triton import knobs

    fake = FakeJit(FakeCompiled())
    kernel_launch = _launch(fake)
    kernel_launch(torch.zeros(8), torch.zeros(8))
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    kernel_launch(torch.zeros(8), torch.zeros(8))
    assert len(fake.through_triton) == 2 and fake.compiled.launches == []


def _copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    tl.store(y_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)))


@pytest.mark.parametrize("change", ["misaligned", "dtype", "shape", "strides"])
def test_tensor_key_keeps_what_triton_specializes_a_tensor_on(change):
    """Triton's binder specializes a pointer argument on its dtype and 16-byte alignment: tensors with equal
    keys must get equal specializations (a plan's direct launch reuses the first call's kernel)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    fn = JITFunction(_copy)  # not triton.jit: under TRITON_INTERPRET that gives the interpreter's function
    binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))
    base = torch.zeros(64, dtype=torch.float16)
    other = {"misaligned": torch.zeros(65, dtype=torch.float16)[1:], "dtype": torch.zeros(64),
             "shape": torch.zeros(128, dtype=torch.float16),
             "strides": torch.zeros(64, 2, dtype=torch.float16)[:, 0]}[change]

    def specialization(x):
        return repr(binder(x, base, BLOCK=16)[1])

    same_key = launch.tensor_key(other)[2:] == launch.tensor_key(base)[2:]  # dtype, device, alignment
    assert (specialization(other) == specialization(base)) == same_key


class FakeCudaLauncher:
    """Triton 3.6's CudaLauncher as _raw_launcher takes it apart: ``launch`` is wrap_handle_tensordesc's wrapper
    around the C launch function (its closure's ``launcher``)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self) -> None:
        self.raw: list[tuple] = []

        def launcher(*args):
            self.raw.append(args)

        def inner(*args):  # Triton's path (never taken here: the fake's first call returns before it)
            launcher(*args)

        self.launch = inner


class FakeDescriptorKernel(FakeCompiled):
    class metadata:
        tensordesc_meta = ({"block": "k"}, {"block": "v"})

    def __init__(self) -> None:
        super().__init__()
        self.run = FakeCudaLauncher()


@pytest.fixture
def triton_36(monkeypatch):
    from triton.backends.nvidia import driver

    encoded: list = []

    def make_tensordesc_arg(arg, metadata):
        encoded.append((arg, metadata))
        return [f"map:{arg}", 64, 128, 1024, 1]

    monkeypatch.setattr(driver, "_BASE_ARGS_FORMAT_LEN", 13, raising=False)
    monkeypatch.setattr(driver, "make_tensordesc_arg", make_tensordesc_arg, raising=False)
    return encoded


def test_descriptors_are_made_for_triton_and_encoded_once_per_address(stream, triton_36):
    compiled = FakeDescriptorKernel()
    fake = FakeJit(compiled)
    fake.arg_names = ["k_desc", "v_desc", "q", "n", "scale", "BLOCK", "FLAG"]
    def maker(name):
        return lambda x: f"{name}@{x.data_ptr()}"

    kernel_launch = launch.KernelLaunch(fake, (132,), scalars=(32, 0.5), constexprs={"FLAG": True, "BLOCK": 16},
                                        descriptors=(maker("k"), maker("v")))
    k, v, q, q2, k2 = (torch.zeros(8) for _ in range(5))
    kernel_launch(k, v, q)  # Triton's path gets the made descriptors
    assert fake.through_triton[0][1] == (f"k@{k.data_ptr()}", f"v@{v.data_ptr()}", q, 32, 0.5)
    kernel_launch(k, v, q2)
    kernel_launch(k, v, q)
    kernel_launch(k2, v, q)
    assert len(fake.through_triton) == 1
    assert [meta for _, meta in triton_36] == [{"block": "k"}, {"block": "v"}, {"block": "k"}]  # k, v, then k2
    k_map, k2_map, v_map = (f"map:{name}@{x.data_ptr()}" for name, x in (("k", k), ("k", k2), ("v", v)))
    tail = (32, 0.5, 16, True)
    head = (132, 1, 1, 77, 1234, False, True, None, None, ("metadata",), None, None, None)
    assert compiled.run.raw == [
        (*head, k_map, 64, 128, 1024, 1, v_map, 64, 128, 1024, 1, q2.data_ptr(), *tail),
        (*head, k_map, 64, 128, 1024, 1, v_map, 64, 128, 1024, 1, q.data_ptr(), *tail),
        (*head, k2_map, 64, 128, 1024, 1, v_map, 64, 128, 1024, 1, q.data_ptr(), *tail),
    ]


def test_a_promoted_maker_has_its_descriptors_re_encoded_before_they_are_kept(stream, triton_36, monkeypatch):
    """tma_promotion.Promoted: the direct path re-encodes the descriptor it made (with the maker's promotion) before
    keeping it for its address; a maker without one is left to Triton's encoding."""
    from attention.kernels import tma_promotion

    calls = []

    def reencode(encoded, descriptor, meta, promotion):
        calls.append((descriptor, meta, promotion))
        encoded[0] += f"+promoted{promotion}"

    monkeypatch.setattr(tma_promotion, "reencode", reencode)
    fake = FakeJit(FakeDescriptorKernel())
    fake.arg_names = ["k_desc", "v_desc", "q", "n", "scale", "BLOCK", "FLAG"]
    kernel_launch = launch.KernelLaunch(fake, (132,), scalars=(32, 0.5), constexprs={"FLAG": True, "BLOCK": 16},
                                        descriptors=(tma_promotion.Promoted(lambda x: "k", 3), lambda x: "v"))
    k, v, q = (torch.zeros(8) for _ in range(3))
    for _ in range(3):
        kernel_launch(k, v, q)
    assert calls == [("k", {"block": "k"}, 3)]   # once: the address's entry is kept re-encoded
    assert [launched[13:15] for launched in fake.compiled.run.raw] == [("map:k+promoted3", 64)] * 2
    assert fake.compiled.run.raw[0][18] == "map:v"


def test_a_promotion_that_cannot_apply_says_so(stream, monkeypatch):
    """A launch that Triton's own launcher runs encodes its descriptors itself: a promotion asked for is not applied,
    and a warning says so."""
    from triton.backends.nvidia import driver

    from attention.kernels import tma_promotion

    monkeypatch.setattr(driver, "_BASE_ARGS_FORMAT_LEN", 14, raising=False)  # a launcher this module does not know
    fake = FakeJit(FakeDescriptorKernel())
    fake.arg_names = ["k_desc", "v_desc", "q", "n", "scale", "BLOCK", "FLAG"]
    kernel_launch = launch.KernelLaunch(fake, (132,), scalars=(32, 0.5), constexprs={"FLAG": True, "BLOCK": 16},
                                        descriptors=(tma_promotion.Promoted(str, 0), str))
    with pytest.warns(RuntimeWarning, match="not applied"):
        kernel_launch(torch.zeros(8), torch.zeros(8), torch.zeros(8))


def test_a_tensor_map_of_another_layout_is_left_alone(monkeypatch):
    """tma_promotion.reencode writes only into Triton's PyCUtensorMap whose bytes match a fresh encoding: anything
    else is left as it was, with a warning, and nothing is encoded into it."""
    from attention.kernels import tma_promotion

    writes = []
    monkeypatch.setattr(tma_promotion, "_encode", lambda target, *args: writes.append(target) or 0)
    tensor_map = object()
    encoded = [tensor_map, 64, 128]
    with pytest.warns(RuntimeWarning, match="not laid out as expected"):
        tma_promotion.reencode(encoded, None, {}, 0)
    assert writes == [] and encoded == [tensor_map, 64, 128]


def test_an_unknown_launcher_sends_descriptor_kernels_through_triton(stream, monkeypatch):
    from triton.backends.nvidia import driver

    monkeypatch.setattr(driver, "_BASE_ARGS_FORMAT_LEN", 14, raising=False)  # another Triton's layout
    fake = FakeJit(FakeDescriptorKernel())
    fake.arg_names = ["k_desc", "v_desc", "q", "n", "scale", "BLOCK", "FLAG"]
    kernel_launch = launch.KernelLaunch(fake, (132,), scalars=(32, 0.5), constexprs={"FLAG": True, "BLOCK": 16},
                                        descriptors=(str, str))
    for _ in range(3):
        kernel_launch(torch.zeros(8), torch.zeros(8), torch.zeros(8))
    assert len(fake.through_triton) == 3 and fake.compiled.run.raw == []
    assert kernel_launch._direct is False  # decided once, not after every call


def test_layout_numbers_are_equal_for_equal_layouts_and_never_reused(monkeypatch):
    """A layout's number (what kept plans' keys hold of a cache's buffers): one number per layout; once the table
    is dropped, a new layout gets a number no earlier layout had, so no kept plan can match it by accident."""
    first = launch.layout_number((("sizes", 1),))
    assert launch.layout_number((("sizes", 1),)) == first
    second = launch.layout_number((("sizes", 2),))
    assert second != first
    monkeypatch.setattr(launch, "_LAYOUT_NUMBERS", {})   # as when the table is full and dropped
    assert launch.layout_number((("sizes", 3),)) not in (first, second)


def test_a_launch_runs_with_its_tensors_device_current(stream, monkeypatch):
    """Tensors on a GPU other than the current one (a model spread over GPUs in one process): Triton's path and the
    direct launch both run with that device current (Triton and the launcher take the current device's stream),
    and the current device is given back. Devices here are numbers: no GPU."""
    current = FakeCurrentDevice()
    monkeypatch.setattr(launch, "_current_device", current.read)
    monkeypatch.setattr(launch.torch.cuda, "device", current.device)
    triton_devices = []

    class DeviceJit(FakeJit):
        def __getitem__(self, grid):
            triton_devices.append(current.index)
            return super().__getitem__(grid)

    compiled = FakeCompiled()
    compiled.run = lambda *args: compiled.launches.append(current.index)
    kernel_launch = _launch(DeviceJit(compiled))
    kernel_launch._device = 1   # what the first call records from its tensors' device (cuda:1)
    x, y = torch.zeros(8), torch.ones(8)
    kernel_launch(x, y)
    kernel_launch(x, y)
    assert triton_devices == [1] and compiled.launches == [1] and current.index == 0
    kernel_launch._device = 0   # tensors on the current device: no guard
    kernel_launch(x, y)
    assert compiled.launches == [1, 0]


def test_cpu_tensors_outside_the_interpreter_are_refused_naming_the_cause(monkeypatch):
    """Where Triton compiles for a GPU, CPU tensors fail in its launcher with a message that names neither the
    kernel nor the interpreter; the call says why (and the kernel's name where it has one: tests/test_kernels.py),
    and nothing reaches Triton."""
    monkeypatch.setattr(launch, "_compiles_for_a_gpu", lambda fn: True)   # as a triton.jit function outside it
    fake = FakeJit(FakeCompiled())
    cause = r"a Triton kernel got CPU tensors.*TRITON_INTERPRET=1.*move the tensors to CUDA"
    with pytest.raises(ValueError, match=cause):
        _launch(fake)(torch.zeros(8), torch.ones(8))
    assert fake.through_triton == []


def test_an_interpreter_that_cannot_run_a_kernel_says_why(monkeypatch):
    """Triton before 3.7 interprets with numpy < 2.4 only; a direct caller of the kernels (no selection to ask) hears
    why, not the interpreter's "only 0-dimensional arrays can be converted to Python scalars". The kernels that take
    no loop bound from a tensor run there (refusing them all before they ran failed the launch's own tests on the
    device's numpy 2.5, 2026-12-06)."""
    from triton.runtime.errors import InterpreterError

    reason = "Triton 3.6.0's interpreter cannot run the kernels with numpy 2.5.2 (...)"
    monkeypatch.setattr(launch, "interpreter_numpy_conflict", lambda: reason)
    numpy_error = TypeError("only 0-dimensional arrays can be converted to Python scalars")
    for error in (numpy_error, InterpreterError(repr(numpy_error))):   # the interpreter wraps it in some paths
        with pytest.raises(RuntimeError, match=r"^a Triton kernel cannot run: Triton 3\.6\.0's interpreter") as raised:
            _launch(FakeJit(None, error))(torch.zeros(8), torch.ones(8))
        assert raised.value.__cause__ is error
    with pytest.raises(TypeError, match="missing"):   # the kernel's own errors stay its own
        _launch(FakeJit(None, TypeError("missing a required argument: 'n'")))(torch.zeros(8), torch.ones(8))
    fake = FakeJit(FakeCompiled())
    _launch(fake)(torch.zeros(8), torch.ones(8))   # a kernel the conflict does not reach runs
    assert len(fake.through_triton) == 1
    monkeypatch.setattr(launch, "interpreter_numpy_conflict", lambda: None)   # no conflict: the error as it came
    with pytest.raises(TypeError, match="only 0-dimensional arrays"):
        _launch(FakeJit(None, numpy_error))(torch.zeros(8), torch.ones(8))


def test_only_a_compiling_triton_function_takes_the_check():
    """The refusal's test of the launch's function: triton.jit outside the interpreter makes a JITFunction (Gluon's
    too); inside it, an InterpretedFunction, which takes CPU tensors; tests' recording stand-ins are neither."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def kernel(x):
        pass

    assert launch._compiles_for_a_gpu(JITFunction(kernel))
    assert not launch._compiles_for_a_gpu(InterpretedFunction(kernel))
    assert not launch._compiles_for_a_gpu(FakeJit(None))
