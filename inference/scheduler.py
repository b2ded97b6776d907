"""A toy continuous-batching scheduler: request traffic for the serving simulation and the demo.

Requests arrive at random times (exponential inter-arrival gaps) with a random prompt length and
an exponentially distributed number of tokens to generate. Every iteration the scheduler builds
the ``step_dict`` for ``InferenceParams.pre_step``: running sequences first in their previous
order, then newly admitted ones. A sequence in its prompt advances by up to
``prefill_chunk_size`` tokens (chunked prefill); a generating one by 1, or by a random
1..``max_decode_tokens`` (multi-token verification). When the paged cache is full the step is
retried with fewer new sequences and, failing that, the newest running sequence is preempted
(its cache is released and it is later recomputed from scratch) -- possible because a refused
``pre_step`` changes nothing.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from inference.errors import KVCacheFullError

__all__ = ["ContinuousBatchingScheduler", "Request"]


@dataclass
class Request:
    """One request: ``total_len`` tokens go through the model, the first ``prompt_len`` as prompt."""

    seq_id: int
    arrival_step: int
    prompt_len: int
    total_len: int
    processed: int = 0  # tokens already in the KV cache
    prefill_target: int = 0  # tokens to (re)compute as prompt; grows past prompt_len after preemption
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.prefill_target = self.prompt_len

    @property
    def finished(self) -> bool:
        return self.processed >= self.total_len


class ContinuousBatchingScheduler:
    """Builds one ``step_dict`` per iteration for a random stream of requests.

    Args:
        num_requests: how many requests arrive in total.
        max_batch_size, max_sequence_length: the cache's limits (a request never exceeds them).
        max_prompt_len: prompt lengths are uniform in ``1..max_prompt_len``.
        mean_new_tokens: mean of the exponential number of tokens after the prompt (>= 1).
        prefill_chunk_size: most prompt tokens per sequence per step.
        max_decode_tokens: 1 for plain decode; k > 1 draws each decode step in ``1..k``.
        max_ctx_len: the cache's ``InferenceParams.max_ctx_len`` (the most new tokens a sequence may bring in one
            step), when it has one: ``prefill_chunk_size`` and ``max_decode_tokens`` above it are refused, since
            ``pre_step`` would refuse every such step.
        arrival_rate: mean arrivals per step.
        seed: seeds the traffic and the step lengths.

    Example::

        >>> import torch
        >>> from inference import InferenceParams
        >>> from inference.scheduler import ContinuousBatchingScheduler
        >>> inference_params = InferenceParams(4, 64, num_heads_kv=2, head_dim_k=16, dtype=torch.float32,
        ...                                    is_paged=True, page_size=16, total_num_pages=8)
        >>> scheduler = ContinuousBatchingScheduler(8, max_batch_size=4, max_sequence_length=64,
        ...                                         max_prompt_len=20, mean_new_tokens=10)
        >>> while not scheduler.done:
        ...     step_dict = scheduler.schedule(inference_params.pre_step)
        ...     # run the model here on tokens [processed, processed + step_len) of each sequence
        ...     scheduler.complete_step()
        >>> scheduler.time, scheduler.preemptions   # steps taken; 8 pages for 4 x 64 tokens is over-subscribed
        (65, 4)
    """

    def __init__(
        self,
        num_requests: int,
        max_batch_size: int,
        max_sequence_length: int,
        max_prompt_len: int,
        mean_new_tokens: float,
        prefill_chunk_size: int = 16,
        max_decode_tokens: int = 1,
        arrival_rate: float = 1.0,
        seed: int = 0,
        max_ctx_len: int | None = None,
    ) -> None:
        if max_ctx_len is not None:
            for name, value in (("prefill_chunk_size", prefill_chunk_size), ("max_decode_tokens", max_decode_tokens)):
                if value > max_ctx_len:
                    raise ValueError(f"{name}={value} exceeds max_ctx_len={max_ctx_len}: InferenceParams.pre_step "
                                     "refuses a step that brings a sequence more tokens than that")
        self.rng = random.Random(seed)
        self.max_batch_size = max_batch_size
        self.prefill_chunk_size = prefill_chunk_size
        self.max_decode_tokens = max_decode_tokens
        self.requests: list[Request] = []
        arrival = 0.0
        for seq_id in range(num_requests):
            prompt_len = self.rng.randint(1, min(max_prompt_len, max_sequence_length - 1))
            new_tokens = max(1, round(self.rng.expovariate(1.0 / mean_new_tokens)))
            total_len = min(prompt_len + new_tokens, max_sequence_length)
            self.requests.append(Request(seq_id, int(arrival), prompt_len, total_len))
            arrival += self.rng.expovariate(arrival_rate)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.step_dict: OrderedDict[int, int] = OrderedDict()
        self.time = 0
        self.preemptions = 0
        self._next_arrival = 0

    @property
    def done(self) -> bool:
        """True once every request has arrived and finished."""
        return self._next_arrival == len(self.requests) and not self.waiting and not self.running

    def _step_len(self, request: Request) -> int:
        if request.processed < request.prefill_target:
            return min(self.prefill_chunk_size, request.prefill_target - request.processed)
        draft = self.rng.randint(1, self.max_decode_tokens)
        return min(draft, request.total_len - request.processed)

    def schedule(self, pre_step: Callable[[OrderedDict[int, int]], None]) -> OrderedDict[int, int]:
        """Plan this iteration and commit it with ``pre_step`` (retrying on ``KVCacheFullError``).

        Returns the committed ``step_dict`` (empty when nobody is running this step).
        """
        self.running = [request for request in self.running if not request.finished]
        while self._next_arrival < len(self.requests) and self.requests[self._next_arrival].arrival_step <= self.time:
            self.waiting.append(self.requests[self._next_arrival])
            self._next_arrival += 1
        admitted = self.waiting[: self.max_batch_size - len(self.running)]
        step_lens = {request.seq_id: self._step_len(request) for request in self.running + admitted}
        running, preempted = list(self.running), []
        while True:
            batch = running + admitted
            step_dict = OrderedDict((request.seq_id, step_lens[request.seq_id]) for request in batch)
            try:
                pre_step(step_dict)
                break
            except KVCacheFullError:
                if admitted:
                    admitted.pop()
                elif len(running) > 1:
                    preempted.append(running.pop())
                else:   # nothing was committed: the requests stay as they were
                    raise
        for request in preempted:   # the cache released them with this pre_step
            self._preempt(request)
        self.waiting = [request for request in self.waiting if request not in admitted]
        self.running = batch
        self.step_dict = step_dict
        return step_dict

    def _preempt(self, request: Request) -> None:
        # Recompute preemption: every token it had is re-prefilled when it is admitted again.
        request.prefill_target = max(request.prefill_target, request.processed)
        request.processed = 0
        request.preemptions += 1
        self.preemptions += 1
        self.waiting.insert(0, request)

    def complete_step(self) -> None:
        """Record that this iteration's tokens went through the model; advance the clock."""
        for request in self.running:
            request.processed += self.step_dict[request.seq_id]
        self.step_dict = OrderedDict()
        self.time += 1
