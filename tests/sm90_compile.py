"""Compile the Triton kernels for sm90 (down to the cubin) on a machine without a GPU.

Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) runs kernels as Python: code that the real
compiler rejects can pass there. Two such bugs once reached the H200: a small-tile branch behind a
runtime bool, compiled with a 0-row tile when the variant was off, and a helper with two `return`s
of different shapes under a constexpr `if`. This script records every launch that
``attention_forward`` and the KV append make for a set of configurations (``KernelLaunch`` is
patched to record, not launch) and compiles each with Triton's CUDA back end, which needs no driver
(Triton ships ptxas), checking the shared memory it asks for against sm90's limit, then the Gluon sm90
kernel (attention_fwd_hopper.py), its mixed-batch kernels (attention_mixed_hopper.py,
attention_mixed_roles_hopper.py) and its decode kernel (attention_decode_hopper.py) on a set of their launches
(hopper_launches, mixed_hopper_launches, mixed_roles_hopper_launches, decode_hopper_launches: on CPU,
attention_forward never plans them).

Run without TRITON_INTERPRET (tests/test_kernel_compile.py starts it in a subprocess; ~30 s on 2 cores):
    python -m tests.sm90_compile [--registers]   # one line per launch (with ptxas's register and
                                                 # spill counts); exits 1 on a failure
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any

import torch

LAUNCH_OPTIONS = ("maxnreg", "launch_pdl")
"""Launch options (besides warps and stages) that recorded launches carry with their constexprs."""

SHARED_MEMORY_LIMIT = 232448
"""Bytes of shared memory one block may use on sm90 (H100 / H200): a launch above it fails there."""


def compile_for_sm90(fn: Any, args: tuple, constexprs: dict, num_warps: int, num_stages: int) -> Any:
    """Compile one launch of JIT function ``fn`` for sm90 down to a cubin (Triton bundles ptxas), with
    the argument specialization a real launch gets (pointer alignment, integers divisible by 16: without
    it no load is vectorized or pipelined, and register counts mean nothing); raises Triton's
    CompilationError, or ValueError when it needs more shared memory than sm90 has."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    constexprs = dict(constexprs)
    options = {name: constexprs.pop(name, None) for name in LAUNCH_OPTIONS}  # recorded with the constexprs
    kwargs = dict(constexprs, num_warps=num_warps, num_stages=num_stages,
                  **{name: value for name, value in options.items() if value is not None})
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constants, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=target, options=options.__dict__)
    if kernel.metadata.shared > SHARED_MEMORY_LIMIT:
        raise ValueError(f"needs {kernel.metadata.shared} bytes of shared memory; sm90 has {SHARED_MEMORY_LIMIT}")
    return kernel


def register_usage(kernel: Any) -> str:
    """ptxas's verdict on a compiled kernel's PTX: registers per thread and spill bytes (Triton's own
    counts need a driver). Spills of the production tiles are a hint of where a kernel loses time."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as handle:
        handle.write(kernel.asm["ptx"])
        handle.flush()
        result = subprocess.run([ptxas, "-arch=sm_90a", "-v", handle.name, "-o", os.devnull], capture_output=True,
                                text=True)
    registers = re.search(r"Used (\d+) registers", result.stderr)
    spills = re.search(r"(\d+) bytes spill stores", result.stderr)
    return f"{registers.group(1) if registers else '?'} registers, {spills.group(1) if spills else '?'} B spilled"


def recorded_launches(calls: list[dict]) -> list[tuple[str, Any, tuple, dict, int, int]]:
    """Run ``attention_forward`` once per keyword set in ``calls`` with launches recorded, not run."""
    from attention.kernels import attention_forward, launch

    recorded: list[tuple[str, Any, tuple, dict, int, int]] = []

    def record(self, *tensors):
        constexprs = {**self.constexprs, **{k: v for k, v in self.options.items() if k in LAUNCH_OPTIONS}}
        recorded.append((label, self.fn, tensors + self.scalars, constexprs, self.options.get("num_warps", 4),
                         self.options.get("num_stages", 3)))

    launch.KernelLaunch.__call__ = record
    for call in calls:
        label = call.pop("label")
        inputs = _inputs(call.pop("paged"), call.pop("head_dim", 64))
        attention_forward(*inputs.pop("tensors"), **{**inputs, **call})
    from inference.kv_append_triton import append_triton

    cache = torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16)
    page_table = torch.zeros(2, 4, dtype=torch.int32)
    cu_q, cu_kv = torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([0, 9, 40], dtype=torch.int32)
    for qkv_format, new in (("thd", torch.zeros(4, 2, 64)), ("bshd", torch.zeros(2, 3, 2, 64)),
                            ("sbhd", torch.zeros(3, 2, 2, 64))):
        label = f"KV append {qkv_format}"
        new = new.to(torch.bfloat16)
        append_triton(new, new, cache, cache, page_table, cu_q, cu_kv, qkv_format)
    return recorded


def _inputs(paged: bool, head_dim: int) -> dict:
    """Small CPU tensors: 3 sequences (a decode, a chunk, a prefill), GQA 4/2."""
    q = torch.zeros(1, 24, 4, head_dim, dtype=torch.bfloat16).expand(3, -1, -1, -1)
    out = torch.zeros(1, 24, 4, head_dim, dtype=torch.bfloat16).expand(3, -1, -1, -1)
    cu_q = torch.tensor([0, 1, 9, 24], dtype=torch.int32)
    cu_kv = torch.tensor([0, 300, 700, 715], dtype=torch.int32)
    inputs = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, q_start=cu_q[:-1], max_seqlen_q=15, max_seqlen_kv=400,
                  total_q=24, softmax_scale=0.125, causal=True, bottom_right=True)
    if paged:
        k = v = torch.zeros(64, 16, 2, head_dim, dtype=torch.bfloat16)
        inputs["page_table"] = torch.zeros(3, 25, dtype=torch.int32)
    else:
        k = v = torch.zeros(3, 512, 2, head_dim, dtype=torch.bfloat16)
    inputs["tensors"] = (q, k, v, out)
    return inputs


def configurations() -> list[dict]:
    """The production tiles of head dims 128 and 256 (with their tuned variants); at d 64 the default
    configs, each variant alone and together, splits (the combine kernel), ALiBi, sinks, windows."""
    from attention.kernels.configs import select_forward_config

    prefill = select_forward_config(head_dim_qk=64, head_dim_v=64, group_size=2, max_seqlen_q=400, interpret=False,
                                    tuned=False)
    decode = select_forward_config(head_dim_qk=64, head_dim_v=64, group_size=2, max_seqlen_q=1, interpret=False,
                                   tuned=False)
    calls: list[dict] = []
    for head_dim in (128, 256):  # the H200's production tiles, tuned variants on: they must fit sm90's shared memory
        for max_q, splits, max_kv in ((400, 1, None), (400, 1, 1024), (400, 1, 2048), (1, 4, None)):
            if max_kv and head_dim != 128:
                continue  # SHORT_KV_TILES are d128's
            for paged in (False, True):
                config = select_forward_config(head_dim_qk=head_dim, head_dim_v=head_dim, group_size=2,
                                               max_seqlen_q=max_q, interpret=False, paged=paged, max_seqlen_kv=max_kv)
                label = (f"d{head_dim} {'paged' if paged else 'contiguous'} m{config.block_m} n{config.block_n} "
                         f"s{config.num_stages}")
                calls.append(dict(label=label, paged=paged, head_dim=head_dim, config=config, num_splits=splits))
                if paged and head_dim == 128 and not max_kv:  # 16-token pages in 64/128-key tiles, read page by page
                    calls.append(dict(label=f"{label} page-granular", paged=True, head_dim=128, num_splits=splits,
                                      config=replace(config, page_granular_tiles=True)))
    for paged in (True, False):
        layout = "paged" if paged else "contiguous"
        calls += [
            dict(label=f"{layout} default", paged=paged),
            dict(label=f"{layout} fused combine with sinks", paged=paged, config=replace(decode, fused_combine=True),
                 num_splits=4, softmax_offset=torch.zeros(4)),
            dict(label=f"{layout} decode tile, 4 splits", paged=paged, config=decode, num_splits=4),
            dict(label=f"{layout} window + alibi + sink", paged=paged, window_size=(64, 0),
                 alibi_slopes=torch.zeros(4), softmax_offset=torch.zeros(4), num_splits=1),
            dict(label=f"{layout} decode tile, 4 splits, zero tail", paged=paged, config=decode, num_splits=4,
                 zero_tail=True),
        ]
        for name, values in (
            ("paged_scalar_ids", dict(paged_scalar_ids=True)),
            ("prefetch_page_ids", dict(prefetch_page_ids=True)),
            ("small_block_m", dict(small_block_m=16)),
            ("rotate_kv_tiles", dict(rotate_kv_tiles=True)),
            ("tma", dict(tma=True)),
            ("fused_combine", dict(fused_combine=True)),
            ("int32_offsets", dict(int32_offsets=True)),
            ("heavy_tiles_first", dict(heavy_tiles_first=True)),
            ("transposed_k_loads", dict(transposed_k_loads=True)),
            ("runtime_page_size", dict(runtime_page_size=True)),
            ("dependent_combine", dict(dependent_combine=True)),
            ("page_granular_tiles", dict(page_granular_tiles=True, prefetch_page_ids=True)),
            ("all", dict(paged_scalar_ids=True, prefetch_page_ids=True, small_block_m=16, rotate_kv_tiles=True,
                         tma=True, fused_combine=True, int32_offsets=True, heavy_tiles_first=True)),
        ):
            for base in (prefill, decode):
                if values.get("small_block_m") and base.block_m <= 16:
                    continue
                calls.append(dict(label=f"{layout} {name} m{base.block_m}", paged=paged,
                                  config=replace(base, block_n=16, **values), num_splits=2))
    return calls


def hopper_launches() -> list[tuple[str, Any, tuple, dict, int, int]]:
    """Launches of the Gluon sm90 kernel (attention_fwd_hopper.py): head dims 64, 128 and 256, causal top-left /
    bottom-right and full, with and without start offsets (with them again zeroing a thd tail), bf16 and fp16, two
    consumer groups and (d64) three, with a plan's launch options."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attention.kernels.attention_fwd_hopper import HOPPER_ROWS_PER_GROUP, attention_fwd_hopper_kernel
    from attention.kernels.hopper_forward import HOPPER_TILE, THREE_GROUP_REGISTERS

    launches = []
    cu = torch.zeros(3, dtype=torch.int32)
    for head_dim, dtype, causal, bottom_right, starts, page_size, groups in (
            (128, torch.bfloat16, True, False, True, 0, 2), (128, torch.bfloat16, True, True, False, 0, 2),
            (128, torch.float16, False, False, True, 0, 2), (64, torch.bfloat16, True, True, True, 0, 2),
            (64, torch.float16, False, False, False, 0, 2), (128, torch.bfloat16, True, True, False, 256, 2),
            (128, torch.bfloat16, True, True, False, 16, 2), (64, torch.float16, False, False, False, 32, 2),
            (256, torch.bfloat16, True, True, True, 0, 2), (256, torch.float16, False, False, False, 16, 2),
            (64, torch.bfloat16, True, True, True, 0, 3), (64, torch.float16, False, False, False, 16, 3)):
        block_n, stages, registers, pingpong, _ = HOPPER_TILE[head_dim]
        if groups == 3:
            registers = min(registers, THREE_GROUP_REGISTERS)
        element = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
        q = torch.zeros(256, 4 * head_dim, dtype=dtype)
        k = torch.zeros(256, 2 * head_dim, dtype=dtype)

        def descriptor(x: torch.Tensor, rows: int, head_dim: int = head_dim, element: Any = element) -> Any:
            block = [rows, head_dim]
            return TensorDescriptor.from_tensor(x, block, gl.NVMMASharedLayout.get_default_for(block, element))

        kv_rows = min(block_n, page_size) if page_size else block_n  # small pages: a TMA load per page
        args = (descriptor(q, HOPPER_ROWS_PER_GROUP), descriptor(k, kv_rows), descriptor(k, kv_rows),
                torch.zeros(256, 4, head_dim, dtype=dtype), cu, cu, cu, cu, cu, 0, 0, 0, 0, 4 * head_dim, 8, 0.18,
                4, 200)
        constexprs = dict(GROUP_SIZE=2, BLOCK_N=block_n, STAGES=stages, PAGE_SIZE=page_size, CAUSAL=causal,
                          BOTTOM_RIGHT=bottom_right,
                          HAS_Q_START=starts, HAS_KV_START=starts, CONSUMER_REGISTERS=registers, PINGPONG=pingpong,
                          GROUPS=groups, maxnreg=168 if groups == 2 else 128)
        label = (f"d{head_dim} {str(dtype)[6:]} {'causal' if causal else 'full'}"
                 f"{' bottom-right' if bottom_right else ''}"
                 f"{' + starts' if starts else ''}{f' page {page_size}' if page_size else ''}"
                 f"{' 3 groups' if groups == 3 else ''}")
        launches.append((label, attention_fwd_hopper_kernel, args, constexprs, 4, 1))
        if starts:  # thd's launches with rows past the last sequence (zero_tail) start at cu_seqlens_q
            launches.append((f"{label} zero tail", attention_fwd_hopper_kernel, args,
                             dict(constexprs, ZERO_TAIL=True), 4, 1))
    return launches


def mixed_hopper_launches() -> list[tuple[str, Any, tuple, dict, int, int]]:
    """Launches of the Gluon sm90 mixed-batch kernel (attention_mixed_hopper.py) with its plans' tiles: 16-token
    pages causal bottom-right at d128 (decode tiles of 8 rows), a non-paged cache with start offsets (16 rows),
    256-token pages at d64 without a mask (64 rows); the first two again with a heavy prefill's tiles (128-key
    prefill tiles, one decode V slot) and 64-token pages with 32-row decode tiles on one, and 16-token pages and a
    non-paged cache at d64 (8 and 16 rows: 128-key prefill tiles, the whole ring). The heavy prefills' launches
    take their prefill items off the queue in L2 sections (QUEUE), as a long prefill's do. The first and fourth
    again as the pair a plan without host lengths launches (TILE_RULE 2 / 1: the device's lengths pick one)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attention.kernels.attention_mixed_hopper import attention_mixed_hopper_kernel
    from attention.kernels.hopper_mixed import PREFILL_TO_DECODE_RATIO, _tile

    launches = []
    cu = torch.zeros(3, dtype=torch.int32)
    for head_dim, page_size, causal, starts, decode_rows, heavy_prefill, rule in (
            (128, 16, True, False, 8, False, 0), (128, 0, True, True, 16, False, 0),
            (64, 256, False, False, 64, False, 0), (128, 16, True, False, 8, True, 0),
            (128, 0, True, True, 16, True, 0), (128, 64, True, False, 32, True, 0),
            (64, 16, True, False, 8, False, 0), (64, 0, True, True, 16, False, 0),
            (128, 16, True, False, 8, False, 2), (128, 16, True, False, 8, True, 1)):
        tile = _tile(head_dim, decode_rows, heavy_prefill, page_size)
        block_n, stages, decode_block_n, decode_stages, consumer_registers, decode_registers, maxnreg = tile[:7]
        q = torch.zeros(256, 4 * head_dim, dtype=torch.bfloat16)
        k = torch.zeros(256, 2 * head_dim, dtype=torch.bfloat16)

        def descriptor(x: torch.Tensor, rows: int, head_dim: int = head_dim, page_size: int = page_size) -> Any:
            block = [min(rows, page_size) if page_size else rows, head_dim]
            return TensorDescriptor.from_tensor(x, block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

        args = (descriptor(q, 64, page_size=0), descriptor(k, block_n), descriptor(k, block_n),
                descriptor(k, decode_block_n), descriptor(k, decode_block_n), q, torch.zeros(256, 4, head_dim),
                cu, cu, cu, cu, cu, cu, 2, 2, 0, 0, 0, 0, 4 * head_dim, 4 * head_dim, 8, 0.18, 256, 2)
        constexprs = dict(GROUP_SIZE=2, BLOCK_N=block_n, STAGES=stages, DECODE_BLOCK_N=decode_block_n,
                          DECODE_STAGES=decode_stages, PAGE_SIZE=page_size, CAUSAL=causal, BOTTOM_RIGHT=causal,
                          HAS_Q_START=starts, HAS_KV_START=starts, LOG2_MAX_SEQS=8, DECODE_ROWS=decode_rows,
                          DECODE_V_STAGES=(*tile, 0)[7],
                          CONSUMER_REGISTERS=consumer_registers, DECODE_REGISTERS=decode_registers, QUEUE=heavy_prefill,
                          TILE_RULE=rule, RULE_RATIO=PREFILL_TO_DECODE_RATIO if rule else 0, maxnreg=maxnreg)
        label = (f"mixed d{head_dim} {f'page {page_size}' if page_size else 'non-paged'}{' causal' if causal else ''}"
                 f"{' prefill tile' if heavy_prefill else ''}{f' device rule {rule}' if rule else ''}")
        launches.append((label, attention_mixed_hopper_kernel, args, constexprs, 4, 1))
    return launches


def mixed_roles_hopper_launches() -> list[tuple[str, Any, tuple, dict, int, int]]:
    """Launches of the Gluon sm90 mixed-batch kernel with one role a program (attention_mixed_roles_hopper.py):
    16-token pages causal bottom-right at d128 with three prefill splits (decode tiles of 8 rows), a non-paged cache
    with start offsets and one split (16 rows), 256-token pages at d64 without a mask, two splits (64 rows)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attention.kernels.attention_mixed_roles_hopper import attention_mixed_roles_hopper_kernel
    from attention.kernels.hopper_mixed_roles import MIXED_ROLES_TILE

    launches = []
    cu = torch.zeros(3, dtype=torch.int32)
    partial = torch.zeros(16, dtype=torch.float32)
    for head_dim, page_size, causal, starts, decode_rows, splits in ((128, 16, True, False, 8, 3),
                                                                     (128, 0, True, True, 16, 1),
                                                                     (64, 256, False, False, 64, 2)):
        block_n, stages, registers, maxnreg, merge_rows = MIXED_ROLES_TILE[head_dim]
        q = torch.zeros(256, 4 * head_dim, dtype=torch.bfloat16)
        k = torch.zeros(256, 2 * head_dim, dtype=torch.bfloat16)

        def descriptor(x: torch.Tensor, rows: int, head_dim: int = head_dim, page_size: int = page_size) -> Any:
            block = [min(rows, page_size) if page_size else rows, head_dim]
            return TensorDescriptor.from_tensor(x, block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

        args = (descriptor(q, 64, page_size=0), descriptor(k, block_n), descriptor(k, block_n),
                descriptor(k, block_n // 2), descriptor(k, block_n // 2), q, torch.zeros(256, 4, head_dim), partial,
                partial, torch.zeros(16, dtype=torch.int32), cu, cu, cu, cu, cu, 2, 2, 0, 0, 0, 0, 4 * head_dim,
                4 * head_dim, 8, 0.18, 256, 4096, 512, 64, 8)
        constexprs = dict(GROUP_SIZE=2, BLOCK_N=block_n, STAGES=stages, PAGE_SIZE=page_size, CAUSAL=causal,
                          BOTTOM_RIGHT=causal, HAS_Q_START=starts, HAS_KV_START=starts, LOG2_MAX_SEQS=8,
                          DECODE_ROWS=decode_rows, PREFILL_SPLITS=splits,
                          SPLITS_BLOCK=max(2, 1 << (splits - 1).bit_length()),
                          MERGE_ROWS=merge_rows, CONSUMER_REGISTERS=registers, maxnreg=maxnreg)
        label = (f"mixed roles d{head_dim} {f'page {page_size}' if page_size else 'non-paged'}"
                 f"{' causal' if causal else ''}, {splits} splits")
        launches.append((label, attention_mixed_roles_hopper_kernel, args, constexprs, 4, 1))
    return launches


def decode_hopper_launches() -> list[tuple[str, Any, tuple, dict, int, int]]:
    """Launches of the Gluon sm90 decode kernel (attention_decode_hopper.py) with DECODE_HOPPER_TILE: 16-token pages
    causal bottom-right at d128 writing split partials and merging them (8 rows), a non-paged cache with start
    offsets writing the output (32 rows), 256-token pages at d64 without a mask (64 rows), and pages it gathers by
    cp.async (GATHER, DECODE_HOPPER_GATHER_TILE): 1 token at d128 causal with partials (8 rows), 8 tokens at d64
    (16 rows), and 1 token at d128 with one producer warp and three stages, and with eight warps and six stages (16
    rows, partials); and 128-key tiles (the tile overrides'), 16-token pages and gathered, 8 rows with partials."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attention.kernels.attention_decode_hopper import attention_decode_hopper_kernel
    from attention.kernels.hopper_decode import DECODE_HOPPER_GATHER_TILE, DECODE_HOPPER_TILE

    default_block_n, stages, _, maxnreg = DECODE_HOPPER_TILE
    launches = []
    cu = torch.zeros(3, dtype=torch.int32)
    partial = torch.zeros(16, dtype=torch.float32)
    _, gather_stages, gather_warps, _, gather_maxnreg = DECODE_HOPPER_GATHER_TILE
    for head_dim, page_size, causal, starts, rows, write_partial, gather, ring, block_n, heads in (
            (128, 16, True, False, 8, True, 0, stages, default_block_n, 1),
            (128, 0, True, True, 32, False, 0, stages, default_block_n, 1),
            (64, 256, False, False, 64, False, 0, stages, default_block_n, 1),
            (128, 1, True, False, 8, True, gather_warps, gather_stages, default_block_n, 1),
            (64, 8, False, False, 16, False, gather_warps, gather_stages, default_block_n, 1),
            (128, 1, False, False, 8, False, 1, 3, default_block_n, 1),
            (128, 1, True, False, 16, True, 8, 6, default_block_n, 1),
            (128, 16, True, False, 8, True, 0, 3, 128, 1), (128, 1, True, False, 8, True, 4, 3, 128, 1),
            (128, 16, True, False, 8, True, 0, stages, default_block_n, 2),
            (128, 0, False, False, 8, False, 0, stages, default_block_n, 2),
            (128, 16, True, False, 8, False, 0, 3, 128, 8)):
        q = torch.zeros(256, 4 * head_dim, dtype=torch.bfloat16)
        k = torch.zeros(256, 2 * head_dim, dtype=torch.bfloat16)
        keys = block_n // heads
        block = [min(keys, page_size) if page_size else keys, head_dim]
        descriptor = k if gather else TensorDescriptor.from_tensor(
            k, block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))
        args = (descriptor, descriptor, q, torch.zeros(256, 4, head_dim, dtype=torch.bfloat16), partial, partial,
                cu, cu, cu, cu, cu, cu, 2, 2, 4, 0, 0, 0, 0, 4 * head_dim, 4 * head_dim, 8, 0.18, 4096, 512, 64, 8, 256,
                2 * head_dim if gather else 0, 2 * head_dim if gather else 0)
        constexprs = dict(GROUP_SIZE=max(2, heads), ROWS=rows, BLOCK_N=block_n, STAGES=ring, PAGE_SIZE=page_size,
                          CAUSAL=causal,
                          BOTTOM_RIGHT=causal, HAS_Q_START=starts, HAS_KV_START=starts, WRITE_PARTIAL=write_partial,
                          FUSED_MERGE=write_partial, SPLITS_BLOCK=16, MERGE_ROWS=4, GATHER=gather, HEAD_DIM=head_dim,
                          HEADS=heads,
                          maxnreg=gather_maxnreg if (gather, ring) == (gather_warps, gather_stages) else maxnreg)
        label = (f"decode d{head_dim} {f'page {page_size}' if page_size else 'non-paged'}{' causal' if causal else ''}"
                 f"{' partials' if write_partial else ''}"
                 f"{f' gathered by {gather} warps, {ring} stages' if gather else ''}"
                 f"{f', {block_n}-key tiles' if block_n != default_block_n else ''}"
                 f"{f', {heads} KV heads a tile' if heads > 1 else ''}")
        launches.append((label, attention_decode_hopper_kernel, args, constexprs, 4, 1))
    return launches


def _private_api_missing() -> str | None:
    """compile_for_sm90 binds arguments the way JITFunction.run does, through Triton internals."""
    from triton.runtime import jit

    if not hasattr(jit, "create_function_from_signature") or not hasattr(jit.JITFunction, "_pack_args"):
        return f"Triton {__import__('triton').__version__} lacks the internals this script binds arguments with"
    return None


def check_split_arrival(ptx: str) -> None:
    """The fused combine's protocol in the PTX of a FUSED_COMBINE launch: a CTA barrier after the partial
    stores, then one thread's gpu-scope acq_rel atomic add (the counter counts programs, not threads),
    and merge loads that bypass L1 (other SMs wrote them). Raises ValueError naming what is missing."""
    import re

    # a barrier, at most 12 lines without a global store, then the predicated (one-thread) atomic
    arrival = re.search(r"bar\.sync[^\n]*\n(?:(?!st\.global)[^\n]*\n){0,12}?"
                        r"[^\n]*@%p\d+ atom\.global\.gpu\.acq_rel\.add", ptx)
    if arrival is None:
        raise ValueError("no barrier followed by a single thread's atom.global.gpu.acq_rel.add")
    if "ld.global.cg" not in ptx[arrival.end():]:
        raise ValueError("the merge after the arrival count does not load with .cg")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sm90_compile",
                                     description="Compile every Triton and Gluon kernel configuration for sm90 (no "
                                                 "GPU needed); one line per launch, exit 1 on a failure.")
    parser.add_argument("--registers", action="store_true", help="add ptxas's register and spill counts")
    registers = parser.parse_args(argv).registers
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter replaces the JIT functions this compiles")
    missing = _private_api_missing()
    if missing:
        print(f"SKIP  {missing}")
        return 0
    failures = 0
    launches = (recorded_launches(configurations()) + hopper_launches() + mixed_hopper_launches()
                + mixed_roles_hopper_launches() + decode_hopper_launches())
    for label, fn, args, constexprs, warps, stages in launches:
        try:
            kernel = compile_for_sm90(fn, args, constexprs, warps, stages)
            if constexprs.get("FUSED_COMBINE") or constexprs.get("FUSED_MERGE"):
                check_split_arrival(kernel.asm["ptx"])
            if fn.__name__.endswith("hopper_kernel") and kernel.metadata.num_warps <= warps:
                raise ValueError(f"not warp-specialized: {kernel.metadata.num_warps} warps for a {warps}-warp launch")
            for flag, instruction in (("LAUNCH_DEPENDENTS", "griddepcontrol.launch_dependents"),
                                      ("WAIT_FOR_PRIMARY", "griddepcontrol.wait")):
                if constexprs.get(flag) and instruction not in kernel.asm["ptx"]:
                    raise ValueError(f"{flag} set but the PTX has no {instruction}")
            usage = f"  ({register_usage(kernel)}, {kernel.metadata.shared} B shared)" if registers else ""
            print(f"ok    {fn.__name__:24} {label}{usage}")
        except Exception as error:  # noqa: BLE001 - report every failing launch, then fail
            failures += 1
            print(f"FAIL  {fn.__name__:24} {label}: {type(error).__name__}: {str(error)[-600:]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
