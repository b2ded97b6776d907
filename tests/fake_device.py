"""The current CUDA device as a number, for tests of the device guards without a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class FakeCurrentDevice:
    """``read`` stands in for ``attention.devices.current_device_index`` (``launch`` binds it as ``_current_device``),
    ``device`` for ``torch.cuda.device`` (a torch.device or an index), which makes its device current and gives the
    previous one back.

        >>> current = FakeCurrentDevice()
        >>> with current.device(1):
        ...     current.read()
        1
        >>> current.index
        0
    """

    def __init__(self) -> None:
        self.index = 0

    def read(self) -> int:
        return self.index

    @contextlib.contextmanager
    def device(self, device: Any) -> Iterator[None]:
        before, self.index = self.index, getattr(device, "index", device)
        try:
            yield
        finally:
            self.index = before
