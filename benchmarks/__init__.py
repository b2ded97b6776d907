"""Benchmarks for DotProductAttention's backends: decode, mixed batches, prefill, host overhead.

Run everything with ``python -m benchmarks.run_all --out DIR`` (``make bench``); each suite also
runs alone (``python -m benchmarks.bench_decode --out DIR``). ``--smoke`` runs tiny shapes on the
CPU (the fused kernels under ``TRITON_INTERPRET=1``) to check the scripts, not to measure.
See ``benchmarks/README.md``.
"""
