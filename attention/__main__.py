"""``python -m attention``: versions, devices, and which backends can run here, with reasons."""

from __future__ import annotations

import argparse
import platform

import torch

from attention import selection
from attention.params import AttentionParams
from attention.versions import installed_version

PACKAGES = ("torch", "triton", "flash-attn", "flash-attn-3", "flash-attn-4", "transformers", "numpy")


def _version(dist: str) -> str:
    return installed_version(dist) or "not installed"


def _typical_params(device: str, cc: tuple[int, int] | None) -> AttentionParams:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return AttentionParams(dtype=dtype, device_type=device, compute_capability=cc, qkv_format="thd",
                           kv_format="thd", num_heads=32, num_gqa_groups=8, head_dim_qk=128, head_dim_v=128,
                           attn_mask_type="padding_causal", window_size=(-1, 0), bottom_right_diagonal=False)


def report() -> str:
    lines = [f"python {platform.python_version()} on {platform.machine()}"]
    lines += [f"{name:>13}: {_version(name)}" for name in PACKAGES]
    devices: list[tuple[str, tuple[int, int] | None]] = [("cpu", None)]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            cc = (props.major, props.minor)
            lines.append(f"cuda:{i}: {props.name}, sm{cc[0]}{cc[1]}, {props.multi_processor_count} SMs, "
                         f"{props.total_memory / 2**30:.0f} GiB")
        devices.insert(0, ("cuda", torch.cuda.get_device_capability(0)))
    else:
        lines.append("CUDA: not available")
    disabled = selection.env_disabled()   # a bad NVTE_* value raises here, naming the variable
    for device, cc in devices:
        params = _typical_params(device, cc)
        lines.append(f"\nBackends for a typical {device} call "
                     f"(thd, {str(params.dtype).replace('torch.', '')}, GQA 32/8, d=128, padding_causal):")
        for name in selection.PRIORITY:
            reasons = selection.registry()[name].support_reasons(params)
            state = "available" if not reasons else "unavailable: " + "; ".join(reasons)
            if name in disabled:
                state = f"off in the automatic walk (NVTE_* switch); {state}"
            lines.append(f"  {name:8} {state}")
    return "\n".join(lines)


if __name__ == "__main__":
    argparse.ArgumentParser(prog="python -m attention", description=__doc__).parse_args()
    print(report())
