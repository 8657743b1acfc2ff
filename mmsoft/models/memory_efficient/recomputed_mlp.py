"""``fc2(act(fc1(x)))`` whose backward recomputes the activation.

Autograd would keep three tensors of a transformer MLP for backward: the
input x (C wide), ``fc1``'s output h and the activation's output g (both
4C wide). Here backward recomputes g from h (one element-wise pass), so g
is never kept; with ``keep_hidden=False`` it recomputes h from x as well
(one more matmul), keeping only x.

Gradients, with ``G = dL/dy``:
``dW2 = G^T g``, ``db2 = sum G``, ``dg = G W2``, ``dh = act'(h) dg`` (by
autograd through the recomputed activation), ``dW1 = dh^T x``,
``db1 = sum dh``, ``dx = dh W1``.

``fc2``'s weight and bias are arguments of their own: the caller passes
them with any per-channel output scale already folded in.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.precision import apply_without_autocast, backward_without_autocast


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """(..., C) -> (tokens, C)."""
    return tensor.reshape(-1, tensor.shape[-1])


def _bias_grad(grad: torch.Tensor, bias: Optional[torch.Tensor]):
    return None if bias is None else _flat(grad).sum(0)


class RecomputedMLP(torch.autograd.Function):
    """Autograd function of :func:`recomputed_mlp`."""

    @staticmethod
    def forward(ctx, x, weight1, bias1, weight2, bias2, act, keep_hidden):
        pre = F.linear(x, weight1, bias1)  # h, (..., 4C)
        ctx.save_for_backward(x, pre if keep_hidden else None, weight1, bias1,
                              weight2)
        ctx.act = act
        return F.linear(act(pre), weight2, bias2)  # (..., C)

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_out):
        x, pre, weight1, bias1, weight2 = ctx.saved_tensors
        if pre is None:
            pre = F.linear(x, weight1, bias1)
        with torch.enable_grad():
            pre = pre.detach().requires_grad_()
            hidden = ctx.act(pre)  # g, (..., 4C)
        grad_hidden = grad_out @ weight2  # (..., 4C)
        grad_weight2 = _flat(grad_out).transpose(0, 1) @ _flat(hidden.detach())
        grad_pre, = torch.autograd.grad(hidden, pre, grad_hidden)
        grad_weight1 = _flat(grad_pre).transpose(0, 1) @ _flat(x)
        grad_x = grad_pre @ weight1
        bias2_grad = _flat(grad_out).sum(0) if ctx.needs_input_grad[4] else None
        return (grad_x, grad_weight1, _bias_grad(grad_pre, bias1), grad_weight2,
                bias2_grad, None, None)


def recomputed_mlp(x: torch.Tensor, fc1: nn.Linear, act: nn.Module,
                   weight2: torch.Tensor, bias2: Optional[torch.Tensor],
                   keep_hidden: bool = True) -> torch.Tensor:
    """``fc2(act(fc1(x)))`` without keeping the activation's output.

    Args:
        x (Tensor): Tokens, shape (..., C).
        fc1 (nn.Linear): C -> hidden.
        act (nn.Module): Element-wise activation without state.
        weight2 (Tensor): fc2's weight, shape (C, hidden).
        bias2 (Tensor, optional): fc2's bias, shape (C, ).
        keep_hidden (bool): Keep ``fc1``'s output for backward (True) or
            recompute it from ``x`` (False: less memory, one more matmul).
            Default: True.

    Returns:
        Tensor: Shape (..., C); under autocast in its dtype, as autocast's
        Linear layers.
    """
    return apply_without_autocast(RecomputedMLP, x, fc1.weight, fc1.bias, weight2,
                                  bias2, act, keep_hidden, cast_to='autocast')
