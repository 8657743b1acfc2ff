"""Comparing a layer's memory-efficient path with its plain autograd path.

The plain computation is a copy of the same layer with the switch off
(:func:`~mmsoft.models.common.set_memory_efficient`), i.e. every
operation recorded by autograd as written in the layer's ``forward``.
"""
import contextlib
import copy

import torch

from mmsoft.models.common import set_memory_efficient

TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def plain_module(module):
    """``module`` switched to its plain autograd path (in place)."""
    return set_memory_efficient(module, False)


def outputs_and_gradients(module, inputs, *args, autocast=None):
    """Output, input gradients and parameter gradients of a weighted sum,
    the forward under ``torch.autocast('cpu', dtype=autocast)`` when given."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    module.zero_grad(set_to_none=True)
    context = (contextlib.nullcontext() if autocast is None else
               torch.autocast('cpu', dtype=autocast))
    with context:
        out = module(*inputs, *args)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    return (out.detach(), [t.grad for t in inputs],
            {name: p.grad for name, p in module.named_parameters()})


def assert_same_as_plain(module, inputs, *args, autocast=None, tolerance=None):
    """The memory-efficient ``module`` and its plain-autograd copy give the
    same output and gradients (within ``tolerance``, default
    :data:`TOLERANCE`), in float or under autocast; returns the copy."""
    tolerance = tolerance or TOLERANCE
    reference = copy.deepcopy(module)
    efficient = outputs_and_gradients(module, inputs, *args, autocast=autocast)
    plain_module(reference)
    plain = outputs_and_gradients(reference, inputs, *args, autocast=autocast)
    torch.testing.assert_close(efficient[0], plain[0], **tolerance)
    torch.testing.assert_close(efficient[1], plain[1], **tolerance)
    assert efficient[2].keys() == plain[2].keys()
    for name in plain[2]:
        torch.testing.assert_close(efficient[2][name], plain[2][name], **tolerance,
                                   msg=name)
    return reference


class LayerNormThenMLP(torch.nn.Module):
    """``y + mlp(y)`` with ``y = norm(x)`` (SOFT's post-norm MLP branch), or
    ``mlp(y)`` alone (the pre-norm one); its memory-saving path is
    :func:`~mmsoft.ops.layer_norm.layer_norm_mlp`."""

    memory_efficient = True

    def __init__(self, dims: int, hidden: int, residual: bool = True, **mlp_kwargs):
        super().__init__()
        from mmsoft.models.common import MLP
        self.norm = torch.nn.LayerNorm(dims)
        self.mlp = MLP(dims, hidden, **mlp_kwargs)
        self.residual = residual
        with torch.no_grad():  # an affine that is not the identity
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from mmsoft.ops.layer_norm import layer_norm_mlp
        if self.memory_efficient:
            y, out = layer_norm_mlp(x, self.norm, self.mlp)
        else:
            y = self.norm(x)
            out = self.mlp(y)
        return y + out if self.residual else out
