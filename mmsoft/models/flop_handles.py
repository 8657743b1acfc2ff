"""FLOP counting handles for what mmengine's counter does not see.

mmengine's :class:`~mmengine.analysis.FlopAnalyzer` counts one multiply-add
as one FLOP and only knows matmul/linear/conv/norm/pool-like operators. The
softmax-free attentions spend real work elsewhere: the Gaussian kernel's
exponentials and distance terms, the Newton iterations or the exact solve of
SOFT (hidden inside one autograd function), the norms of XNorm, and the
softmax attention of SOFT's last stage when it runs through
``scaled_dot_product_attention``. The handles below count those with the same
convention: a matrix product of (a x b) by (b x c) is ``a*b*c``, an
element-wise operation one FLOP per output element, a reduction one per
input element.
"""
from math import prod
from typing import Any, Callable, Dict, List

from mmengine.analysis.jit_handles import get_shape

Handle = Callable[[List[Any], List[Any]], int]

ELEMENTWISE_OPS = (
    'aten::exp', 'aten::exp_', 'aten::rsqrt', 'aten::sqrt', 'aten::mul',
    'aten::mul_', 'aten::add', 'aten::add_', 'aten::sub', 'aten::sub_',
    'aten::div', 'aten::div_', 'aten::pow', 'aten::neg', 'aten::clamp_min',
    'aten::reciprocal', 'aten::abs')
# No arithmetic (allocation), or activations, which mmengine and fvcore leave
# out for every model alike.
NOT_COUNTED_OPS = ('aten::ones_like', 'aten::zeros_like', 'aten::empty_like',
                   'aten::eye', 'aten::where', 'aten::repeat', 'aten::repeat_interleave',
                   'aten::gelu', 'aten::silu', 'aten::relu', 'aten::relu_')
REDUCTION_OPS = ('aten::sum', 'aten::amax', 'aten::linalg_vector_norm', 'aten::norm',
                 'aten::frobenius_norm', 'aten::mean')


def elementwise_flops(inputs: List[Any], outputs: List[Any]) -> int:
    """One FLOP per output element."""
    shape = get_shape(outputs[0])
    return prod(shape) if shape is not None else 0


def reduction_flops(inputs: List[Any], outputs: List[Any]) -> int:
    """One FLOP per input element."""
    shape = get_shape(inputs[0])
    return prod(shape) if shape is not None else 0


def sdpa_flops(inputs: List[Any], outputs: List[Any]) -> int:
    """``Q K^T`` and ``attn V``: 2 * B * h * Nq * Nk * d."""
    query, key = get_shape(inputs[0]), get_shape(inputs[1])
    *batch, queries, dims = query
    return 2 * prod(batch) * queries * key[-2] * dims


def inverse_flops(attention: str, solver: str, newton_iters: int) -> int:
    """FLOPs of one m x m bottleneck inverse, as a multiple of m^3.

    Newton: two m x m products per iteration. Cholesky (SOFT exact): m^3/3 for the
    factor and 2m^3/3 to invert it. An eigendecomposition (SOFT++ exact, and
    the Newton closed form of SOFT and SOFT++): about 4m^3/3 to reduce to
    tridiagonal form, m^3 to accumulate the eigenvectors and m^3 to multiply
    them back: an estimate of 10m^3/3. (The SOFT++ scale's product of the
    Newton solvers runs outside the inverse and is counted as a matmul.)
    """
    if solver == 'newton':
        return 2 * newton_iters
    if solver == 'exact' and attention == 'soft':
        return 1
    return 10 / 3


def kernel_inverse_handle(attention: str, solver: str, newton_iters: int) -> Handle:
    """Handle of SOFT's inverse for one (attention, solver, iterations) setting."""
    factor = inverse_flops(attention, solver, newton_iters)

    def handle(inputs: List[Any], outputs: List[Any]) -> int:
        *batch, size, _ = get_shape(inputs[0])
        return int(factor * prod(batch) * size**3)

    return handle


def extra_flop_handles(model) -> Dict[str, Handle]:
    """Handles to add to a FlopAnalyzer for ``model``.

    Args:
        model (nn.Module): Any model; the SOFT inverse handle is configured
            from its :class:`~mmsoft.models.layers.SoftAttention` modules,
            which must then all share one attention, solver and iteration count.

    Returns:
        dict[str, Handle | None]: Operator name to handle (None: known, not
        counted).
    """
    from .layers import SoftAttention
    handles = {op: elementwise_flops for op in ELEMENTWISE_OPS}
    handles.update({op: reduction_flops for op in REDUCTION_OPS})
    handles.update({op: None for op in NOT_COUNTED_OPS})
    handles['aten::scaled_dot_product_attention'] = sdpa_flops
    settings = {(m.attention, m.solver, m.newton_iters)
                for m in model.modules() if isinstance(m, SoftAttention)}
    if len(settings) > 1:
        raise ValueError(f'SOFT attentions of one model use several inverse '
                         f'settings {sorted(settings)}; the FLOP handle needs one.')
    if settings:
        handle = kernel_inverse_handle(*settings.pop())
        for function in ('_ExactInverse', '_NewtonIterations', '_NewtonClosedForm'):
            handles[f'prim::PythonOp.{function}'] = handle
    return handles


def count_flops(model, inputs, with_extra_handles: bool = True):
    """Total FLOPs (multiply-adds) of ``model(*inputs)`` and the analyzer.

    Args:
        model (nn.Module): Model in eval mode.
        inputs (tuple): Positional inputs of its forward.
        with_extra_handles (bool): Add :func:`extra_flop_handles`; False gives
            mmengine's plain count. Default: True.

    Returns:
        tuple[int, FlopAnalyzer]: The total and the analyzer (per-module and
        per-operator breakdowns, unsupported operators).
    """
    from mmengine.analysis import FlopAnalyzer
    analyzer = FlopAnalyzer(model, inputs)
    if with_extra_handles:
        analyzer.set_op_handle(**extra_flop_handles(model))
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer.total(), analyzer
