"""``python -m attention.demo``: a toy transformer serves a request stream through the KV cache.

A small multi-layer transformer with seeded random weights generates greedily for a stream of
requests (random arrivals, prompt lengths and generation lengths) with continuous batching:
every step mixes prompt chunks (chunked prefill) and 1-token decodes, through
``DotProductAttention`` and a paged, over-subscribed ``InferenceParams`` (sequences are preempted
and recomputed when pages run out). After every step the logits of each new token are compared
with a full recomputation of that sequence's whole history (no cache, plain causal attention).
One table row per backend: steps, tokens, tokens/s, max error and the backend that ran.

Example::

    python -m attention.demo                                   # CPU, fp32, automatic backend
    python -m attention.demo --backend unfused,fused --requests 8   # fused: a GPU, or TRITON_INTERPRET=1
    python -m attention.demo --device cuda --dtype bfloat16 --requests 64   # on a GPU
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.dot_product_attention import DotProductAttention
from inference import InferenceParams
from inference.scheduler import ContinuousBatchingScheduler

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCES = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


@dataclass
class DemoConfig:
    """Model and traffic sizes (the defaults finish in seconds on a 2-core CPU)."""

    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    vocab_size: int = 512
    max_batch_size: int = 8
    max_sequence_length: int = 128
    page_size: int = 16
    page_budget: float = 0.35  # fraction of max_batch_size * max_pages_per_seq actually allocated
    num_requests: int = 24
    max_prompt_len: int = 48
    mean_new_tokens: float = 32.0
    prefill_chunk_size: int = 16
    qkv_format: str = "bshd"


class ToyLayer(nn.Module):
    """Pre-norm transformer block; attention goes through ``DotProductAttention`` when cached."""

    def __init__(self, config: DemoConfig, layer_number: int, backend: str | None) -> None:
        super().__init__()
        hidden = config.num_heads * config.head_dim
        self.config = config
        self.norm_attention = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, hidden + 2 * config.num_kv_heads * config.head_dim)
        self.out = nn.Linear(hidden, hidden)
        self.norm_mlp = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.attention = DotProductAttention(
            config.num_heads, config.head_dim, num_gqa_groups=config.num_kv_heads,
            qkv_format=config.qkv_format, attn_mask_type="padding_causal", layer_number=layer_number,
            backend=backend,
        )

    def _split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        q, k, v = self.qkv(self.norm_attention(x)).split(
            [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], dim=-1
        )
        return (q.unflatten(-1, (c.num_heads, c.head_dim)), k.unflatten(-1, (c.num_kv_heads, c.head_dim)),
                v.unflatten(-1, (c.num_kv_heads, c.head_dim)))

    def forward(self, x: Tensor, inference_params: InferenceParams, step_lens: list[int]) -> Tensor:
        """``x``: ``[b, s, hidden]`` new tokens left-aligned; attends to the cached history."""
        q, k, v = self._split_heads(x)
        cu_seqlens_q = inference_params.cu_seqlens_q[: len(step_lens) + 1]
        attended = self.attention(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_q, max_seqlen_q=x.shape[1],
            max_seqlen_kv=inference_params.max_sequence_length, inference_params=inference_params,
        )
        x = x + self.out(attended)
        return x + self.mlp(self.norm_mlp(x))

    def forward_full(self, x: Tensor) -> Tensor:
        """Reference: ``x`` ``[b, L, hidden]`` whole right-padded histories, plain causal SDPA."""
        q, k, v = (t.transpose(1, 2) for t in self._split_heads(x))
        groups = self.config.num_heads // self.config.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        attended = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        x = x + self.out(attended.to(x.dtype).transpose(1, 2).flatten(2))
        return x + self.mlp(self.norm_mlp(x))


class ToyTransformer(nn.Module):
    """Token + learned position embeddings, ``num_layers`` blocks, tied output projection."""

    def __init__(self, config: DemoConfig, backend: str | None) -> None:
        super().__init__()
        hidden = config.num_heads * config.head_dim
        self.token_embedding = nn.Embedding(config.vocab_size, hidden)
        self.position_embedding = nn.Embedding(config.max_sequence_length, hidden)
        self.layers = nn.ModuleList(ToyLayer(config, n + 1, backend) for n in range(config.num_layers))
        self.norm = nn.LayerNorm(hidden)

    def _logits(self, x: Tensor) -> Tensor:
        return self.norm(x) @ self.token_embedding.weight.t() / self.token_embedding.embedding_dim**0.5

    def forward(self, tokens: Tensor, inference_params: InferenceParams, step_lens: list[int]) -> Tensor:
        """``tokens`` ``[b, s]`` left-aligned new tokens -> logits ``[b, s, vocab]``."""
        offsets = inference_params.get_seqlens_pre_step()[: tokens.shape[0], None].long()
        positions = (offsets + torch.arange(tokens.shape[1], device=tokens.device)).clamp(
            max=self.position_embedding.num_embeddings - 1)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for layer in self.layers:
            x = layer(x, inference_params, step_lens)
        return self._logits(x)

    def forward_full(self, tokens: Tensor) -> Tensor:
        """``tokens`` ``[b, L]`` right-padded histories -> logits ``[b, L, vocab]`` (no cache)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for layer in self.layers:
            x = layer.forward_full(x)
        return self._logits(x)


@dataclass
class RunResult:
    backend_requested: str
    backends_used: str
    steps: int
    tokens: int
    seconds: float
    max_error: float
    preemptions: int


def serve(config: DemoConfig, backend: str | None, device: torch.device, dtype: torch.dtype,
          max_steps: int | None, seed: int, progress: bool) -> RunResult:
    """Run the whole request stream once; return the numbers of one table row."""
    from tqdm import tqdm

    torch.manual_seed(seed)
    model = ToyTransformer(config, backend).to(device=device, dtype=dtype).eval()
    max_pages_per_seq = -(-config.max_sequence_length // config.page_size)
    total_num_pages = max(max_pages_per_seq, int(config.page_budget * config.max_batch_size * max_pages_per_seq))
    params = InferenceParams(
        config.max_batch_size, config.max_sequence_length, config.num_kv_heads, config.head_dim, dtype,
        is_paged=True, page_size=config.page_size, total_num_pages=total_num_pages,
        qkv_format=config.qkv_format, device=device,
    )
    for layer_number in range(1, config.num_layers + 1):
        params.allocate_memory(layer_number)
    scheduler = ContinuousBatchingScheduler(
        config.num_requests, config.max_batch_size, config.max_sequence_length, config.max_prompt_len,
        config.mean_new_tokens, prefill_chunk_size=config.prefill_chunk_size, arrival_rate=1.5, seed=seed,
    )
    generator = torch.Generator().manual_seed(seed)
    tokens = {r.seq_id: torch.randint(config.vocab_size, (r.prompt_len,), generator=generator).tolist()
              for r in scheduler.requests}
    steps = processed_tokens = 0
    seconds = max_error = 0.0
    backends_used: set[str] = set()
    bar = tqdm(total=config.num_requests, desc=f"serving [{backend or 'auto'}]", unit="req", disable=not progress)
    with torch.inference_mode():
        while not scheduler.done and (max_steps is None or steps < max_steps):
            step_dict = scheduler.schedule(params.pre_step)
            if not step_dict:
                scheduler.complete_step()
                continue
            starts = [params.sequences_pre_step[seq_id] for seq_id in step_dict]
            step_lens = list(step_dict.values())
            batch = torch.zeros(len(step_dict), max(step_lens), dtype=torch.long)
            for row, (seq_id, start, n) in enumerate(zip(step_dict, starts, step_lens)):
                batch[row, :n] = torch.tensor(tokens[seq_id][start : start + n])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            logits = model(batch.to(device), params, step_lens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds += time.perf_counter() - began
            backends_used.update(layer.attention.last_backend for layer in model.layers)
            max_error = max(max_error, check_against_recomputation(model, tokens, step_dict, starts, logits, device))
            for row, (seq_id, start, n) in enumerate(zip(step_dict, starts, step_lens)):
                request = scheduler.requests[seq_id]
                if start + n == len(tokens[seq_id]) and len(tokens[seq_id]) < request.total_len:
                    tokens[seq_id].append(int(logits[row, n - 1].argmax()))
            finished_before = sum(r.finished for r in scheduler.requests)
            scheduler.complete_step()
            steps += 1
            processed_tokens += sum(step_lens)
            bar.update(sum(r.finished for r in scheduler.requests) - finished_before)
            bar.set_postfix(batch=len(step_dict), tokens=sum(step_lens), max_err=f"{max_error:.1e}")
    bar.close()
    return RunResult(backend or "auto", ", ".join(sorted(backends_used)), steps, processed_tokens, seconds,
                     max_error, scheduler.preemptions)


def check_against_recomputation(model: ToyTransformer, tokens: dict[int, list[int]], step_dict: OrderedDict,
                                starts: list[int], logits: Tensor, device: torch.device) -> float:
    """Max |cached - recomputed| over the logits of every new token of this step."""
    ends = [start + n for start, n in zip(starts, step_dict.values())]
    histories = torch.zeros(len(step_dict), max(ends), dtype=torch.long)
    for row, (seq_id, end) in enumerate(zip(step_dict, ends)):
        histories[row, :end] = torch.tensor(tokens[seq_id][:end])
    full = model.forward_full(histories.to(device))  # right padding is never attended (causal)
    error = 0.0
    for row, (start, n) in enumerate(zip(starts, step_dict.values())):
        error = max(error, (logits[row, :n].float() - full[row, start : start + n].float()).abs().max().item())
    return error


def print_table(results: list[RunResult], device: torch.device, dtype: torch.dtype, tolerance: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"KV-cache serving demo ({device.type}, {str(dtype).removeprefix('torch.')}): backends "
                        "asked and ran",
                  caption=f"check: max |cached - recomputed| logits <= {tolerance:g}", pad_edge=False)
    for column in ("asked", "ran", "steps", "tokens", "tokens/s", "max error", "preempted", "check"):
        table.add_column(column, justify="left" if column in ("asked", "ran") else "right",
                         min_width=max(map(len, column.split())))   # narrow terminals wrap words, never cut them
    for r in results:
        ok = r.max_error <= tolerance
        table.add_row(r.backend_requested, r.backends_used or "-", str(r.steps), str(r.tokens),
                      f"{r.tokens / r.seconds:,.0f}" if r.seconds else "-", f"{r.max_error:.2e}",
                      str(r.preemptions), "[green]pass[/green]" if ok else "[red]FAIL[/red]")
    Console().print(table)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Serve with each backend asked for; 0 when every one ran and passed its check, else 1."""
    parser = argparse.ArgumentParser(prog="python -m attention.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="cpu or cuda (default: cuda if present, else cpu)")
    parser.add_argument("--backend", default="auto",
                        help="comma-separated backends, one table row each: auto, unfused, fused, flash, ...")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many serving steps")
    parser.add_argument("--requests", type=_positive, default=DemoConfig.num_requests)
    parser.add_argument("--layers", type=_positive, default=DemoConfig.num_layers)
    parser.add_argument("--max-batch-size", type=_positive, default=DemoConfig.max_batch_size)
    parser.add_argument("--page-size", type=_positive, default=DemoConfig.page_size)
    parser.add_argument("--qkv-format", choices=["bshd"], default="bshd")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=_positive, default=1,
                        help="CPU threads for torch (tiny matmuls run fastest on one)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    config = DemoConfig(num_layers=args.layers, max_batch_size=args.max_batch_size, page_size=args.page_size,
                        num_requests=args.requests, qkv_format=args.qkv_format)
    tolerance = TOLERANCES[dtype]
    results, refused = [], []
    for name in (part.strip() for part in args.backend.split(",")):
        try:
            results.append(serve(config, None if name == "auto" else name, device, dtype, args.steps, args.seed,
                                 progress=not args.no_progress))
        except ValueError as error:
            refused.append(name)
            print(f"backend {name!r} cannot run here: {error}")
    if results:
        print_table(results, device, dtype, tolerance)
    return 0 if results and not refused and all(r.max_error <= tolerance for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
