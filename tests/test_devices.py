"""attention.devices: a tensor's GPU made current around a launch only where it is not current already."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attention import devices
from tests.fake_device import FakeCurrentDevice


def _tensor(index: int | None) -> SimpleNamespace:
    device = torch.device("cpu") if index is None else torch.device("cuda", index)
    return SimpleNamespace(is_cuda=index is not None, get_device=lambda: -1 if index is None else index, device=device)


def test_another_gpus_tensor_is_made_current_then_given_back(monkeypatch):
    current = FakeCurrentDevice()
    monkeypatch.setattr(devices, "current_device_index", current.read)
    monkeypatch.setattr(devices.torch.cuda, "device", current.device)
    seen = []
    for index in (1, 0, None):
        with devices.on_device_of(_tensor(index)):
            seen.append(current.index)
    assert seen == [1, 0, 0] and current.index == 0


def test_a_current_or_cpu_tensor_enters_no_device_guard(monkeypatch):
    monkeypatch.setattr(devices, "current_device_index", lambda: 0)
    monkeypatch.setattr(devices.torch.cuda, "device", lambda device: (_ for _ in ()).throw(AssertionError(device)))
    for index in (0, None):
        with devices.on_device_of(_tensor(index)):
            pass
