"""attention.kernels.launch.CachedLaunch: which calls reuse a compiled kernel and with what arguments.

A fake JIT function stands in for Triton (no GPU here): it records compiles (the ``fn[grid](...)``
path) and direct launches (``compiled[grid](*all_args)``). The real kernels go through it in the GPU
suite.
"""

from __future__ import annotations

import pytest
import torch

from attention.kernels import launch


class FakeCompiled:
    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


class FakeJit:
    arg_names = ["x", "n", "scale", "BLOCK", "FLAG"]

    def __init__(self) -> None:
        self.compiles: list[tuple] = []
        self.compiled = FakeCompiled()

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.compiles.append((grid, args, kwargs))
            return self.compiled
        return run


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(launch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    return FakeJit()


def test_second_launch_of_a_specialization_skips_the_binder(fake):
    cached = launch.CachedLaunch(fake)
    x = torch.zeros(64)
    cached((4,), x, 32, 0.5, BLOCK=16, FLAG=True, num_warps=4)
    cached((8, 2), x, 48, 0.25, FLAG=True, BLOCK=16, num_warps=4)
    assert len(fake.compiles) == 1
    assert fake.compiles[0][2] == {"BLOCK": 16, "FLAG": True, "num_warps": 4}
    # the grid padded to three dimensions, the constexprs appended in signature order
    assert fake.compiled.launches == [((8, 2, 1), (x, 48, 0.25, 16, True))]


@pytest.mark.parametrize("change", ["misaligned pointer", "int no longer a multiple of 16", "int of 1", "int64",
                                    "dtype", "constexpr", "warps"])
def test_a_different_specialization_compiles_again(fake, change):
    cached = launch.CachedLaunch(fake)
    x = torch.zeros(64)
    args, constexprs, warps = [x, 32, 0.5], {"BLOCK": 16, "FLAG": True}, 4
    cached((1,), *args, **constexprs, num_warps=warps)
    if change == "misaligned pointer":
        args[0] = x[1:]
    elif change == "int no longer a multiple of 16":
        args[1] = 33
    elif change == "int of 1":
        args[1] = 1
    elif change == "int64":
        args[1] = 1 << 40
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    elif change == "constexpr":
        constexprs["BLOCK"] = 32
    else:
        warps = 8
    cached((1,), *args, **constexprs, num_warps=warps)
    assert len(fake.compiles) == 2 and fake.compiled.launches == []


def test_switched_off_always_binds(fake, monkeypatch):
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    cached = launch.CachedLaunch(fake)
    for _ in range(3):
        cached((1,), torch.zeros(8), 16, 1.0, BLOCK=16, FLAG=False)
    assert len(fake.compiles) == 3 and fake.compiled.launches == []
