"""``DotProductAttention.__call__`` skips nn.Module's argument forwarding only where that would just call ``forward``:
hooks (the module's and global ones), an in-place ``module.compile()`` and a parent's compiled graph still run."""

import torch
from torch import nn

from attention import DotProductAttention


def _inputs():
    q, k, v = (torch.randn(2, 5, 4, 16) for _ in range(3))
    return q, k, v


def _module() -> DotProductAttention:
    return DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal", backend="unfused")


def test_the_modules_hooks_run():
    module, (q, k, v) = _module(), _inputs()
    expected = module(q, k, v)
    seen = []
    pre = module.register_forward_pre_hook(lambda mod, args: (args[0] * 0, *args[1:]))
    post = module.register_forward_hook(lambda mod, args, out: seen.append(out.shape) or out + 1)
    out = module(q, k, v)
    torch.testing.assert_close(out, module.forward(q * 0, k, v) + 1)
    assert seen == [expected.shape]
    pre.remove(), post.remove()
    torch.testing.assert_close(module(q, k, v), expected)


def test_a_backward_hook_runs():
    module = _module()
    q, k, v = (x.requires_grad_() for x in _inputs())
    seen = []
    module.register_full_backward_hook(lambda mod, grad_input, grad_output: seen.append(len(grad_output)))
    module(q, k, v).sum().backward()
    assert seen == [1] and q.grad is not None


def test_global_hooks_run():
    module, (q, k, v) = _module(), _inputs()
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        module(q, k, v)
    finally:
        handle.remove()
    assert seen == ["DotProductAttention"]


def test_an_in_place_compile_runs_the_compiled_call():
    torch._dynamo.reset()
    module, (q, k, v) = _module(), _inputs()
    expected = module(q, k, v)
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    module.compile(backend=backend, fullgraph=True)
    torch.testing.assert_close(module(q, k, v), expected)
    assert len(graphs) == 1   # the call went through the compiled one
    torch._dynamo.reset()


def test_a_compiled_parent_traces_through_the_call():
    torch._dynamo.reset()

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = _module()

        def forward(self, q, k, v):
            return self.attention(q, k, v) * 2

    parent, (q, k, v) = Parent(), _inputs()
    expected = parent(q, k, v)
    torch.testing.assert_close(torch.compile(parent, backend="eager", fullgraph=True)(q, k, v), expected)
    torch._dynamo.reset()


def test_an_fx_trace_sees_the_module_call():
    """torch.fx's tracer swaps nn.Module.__call__ to record module calls: with the module a leaf, the graph calls it."""
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = _module()

        def forward(self, q, k, v):
            return self.attention(q, k, v)

    class LeafTracer(torch.fx.Tracer):
        def is_leaf_module(self, module, qualified_name):
            return isinstance(module, DotProductAttention) or super().is_leaf_module(module, qualified_name)

    parent, (q, k, v) = Parent(), _inputs()
    graph = LeafTracer().trace(parent)
    assert [node.target for node in graph.nodes if node.op == "call_module"] == ["attention"]
    torch.testing.assert_close(torch.fx.GraphModule(parent, graph)(q, k, v), parent(q, k, v))
