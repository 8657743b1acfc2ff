"""Matrix products that keep float32 accuracy when matmuls may not.

With TF32 matmuls allowed (``torch.backends.cuda.matmul.allow_tf32``, or
``torch.set_float32_matmul_precision('high' | 'medium')``), a float32
product rounds its operands to 10 mantissa bits: about 3 significant
digits. :func:`float32_matmul` splits each operand into a part that TF32
represents exactly and the remainder, and sums the three products that
matter: a relative error of about 2**-21 per product instead of 2**-11,
within a few units of float32's last place.
"""
import torch

from ...utils.torch_compat import is_compiling

# Clears the 13 low mantissa bits of a float32: what TF32 keeps exactly.
_TF32_MASK = -(1 << 13)


def reduced_precision_matmuls(device: torch.device) -> bool:
    """Whether float32 matmuls on ``device`` may run in reduced precision
    (TF32, or bfloat16 passes), a host-side setting.

    While ``torch.compile`` traces, which cannot read the setting (and
    whose graph outlives it), assumed on CUDA, where TF32 is common, and
    not elsewhere.
    """
    if is_compiling():
        return device.type == 'cuda'
    return torch.get_float32_matmul_precision() != 'highest'


def split_tf32(tensor: torch.Tensor):
    """``(high, low)`` with ``high + low == tensor`` exactly, ``high`` with
    TF32's 10 mantissa bits and ``|low| <= 2**-10 |tensor|``. Float32;
    no gradient (:class:`_Float32Matmul` differentiates the product)."""
    tensor = tensor.detach()
    high = (tensor.view(torch.int32) & _TF32_MASK).view(torch.float32)
    return high, tensor - high


def three_pass_matmul(a: torch.Tensor, b: torch.Tensor, matmul=None) -> torch.Tensor:
    """``a @ b`` from three products of TF32-exact parts,
    ``a_hi b_hi + a_hi b_lo + a_lo b_hi``.

    Args:
        a (Tensor): Shape (..., N, K), float32.
        b (Tensor): Shape (..., K, M), float32.
        matmul (callable, optional): The product used for each pass.
            Default: None (``torch.matmul``).

    Returns:
        Tensor: Shape (..., N, M), float32.
    """
    matmul = matmul or torch.matmul
    a_high, a_low = split_tf32(a)
    b_high, b_low = split_tf32(b)
    return matmul(a_high, b_high) + (matmul(a_high, b_low) + matmul(a_low, b_high))


class _Float32Matmul(torch.autograd.Function):
    """``a @ b`` by :func:`three_pass_matmul`, and its gradients too:
    ``grad @ b^T`` and ``a^T @ grad``, each in three passes."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return three_pass_matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:  # (..., N, K), summed over broadcast dims
            grad_a = three_pass_matmul(grad, b.transpose(-1, -2)).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:  # (..., K, M)
            grad_b = three_pass_matmul(a.transpose(-1, -2), grad).sum_to_size(b.shape)
        return grad_a, grad_b


def float32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accurate to float32 whatever the matmul precision setting,
    gradients included: :func:`three_pass_matmul` for float32 operands while
    reduced-precision matmuls are allowed, else ``torch.matmul``.

    Args:
        a (Tensor): Shape (..., N, K).
        b (Tensor): Shape (..., K, M).

    Returns:
        Tensor: Shape (..., N, M).
    """
    if a.dtype == torch.float32 and b.dtype == torch.float32 \
            and reduced_precision_matmuls(a.device):
        return _Float32Matmul.apply(a, b)
    return torch.matmul(a, b)
