"""FLOP counting handles for what mmengine's counter does not see.

One multiply-add is one FLOP, as mmengine counts: an (a x b) by (b x c)
product is ``a*b*c``, an element-wise operation one FLOP per output element,
a reduction one per input element.
"""
from math import prod
from typing import Any, Callable, Dict, List

from mmengine.analysis.jit_handles import get_shape

Handle = Callable[[List[Any], List[Any]], int]

ELEMENTWISE_OPS = (
    'aten::exp', 'aten::exp_', 'aten::rsqrt', 'aten::sqrt', 'aten::mul',
    'aten::mul_', 'aten::add', 'aten::add_', 'aten::sub', 'aten::sub_',
    'aten::div', 'aten::div_', 'aten::pow', 'aten::neg', 'aten::clamp_min',
    'aten::reciprocal', 'aten::abs', 'aten::rsub', 'aten::cumsum', 'aten::kron')
# No arithmetic (allocation, copies, comparisons for masks), or activations,
# which mmengine and fvcore leave out for every model alike.
NOT_COUNTED_OPS = ('aten::ones_like', 'aten::zeros_like', 'aten::empty_like',
                   'aten::eye', 'aten::where', 'aten::repeat',
                   'aten::repeat_interleave', 'aten::pad', 'aten::lt', 'aten::gelu',
                   'aten::silu', 'aten::relu', 'aten::relu_', 'aten::unflatten')
REDUCTION_OPS = ('aten::sum', 'aten::amax', 'aten::linalg_vector_norm', 'aten::norm',
                 'aten::frobenius_norm', 'aten::mean')
#: The autograd functions that compute a kernel inverse in one traced node.
INVERSE_FUNCTIONS = ('ExactInverse', 'NewtonClosedForm')


def elementwise_flops(inputs: List[Any], outputs: List[Any]) -> int:
    """One FLOP per output element."""
    shape = get_shape(outputs[0])
    return prod(shape) if shape is not None else 0


def baddbmm_flops(inputs: List[Any], outputs: List[Any]) -> int:
    """``input + batch1 @ batch2``: the product's multiply-adds, as mmengine
    counts ``addmm``'s."""
    return prod(get_shape(inputs[1])) * get_shape(inputs[2])[-1]


def sdpa_flops(inputs: List[Any], outputs: List[Any]) -> int:
    """``Q K^T`` and ``attn V``: 2 * B * h * Nq * Nk * d."""
    *batch, queries, dims = get_shape(inputs[0])
    return 2 * prod(batch) * queries * get_shape(inputs[1])[-2] * dims


def kernel_inverse_handle(variant: str, solver: str) -> Handle:
    """Handle of SOFT's one-node m x m inverse for one ``variant`` (``'soft'``
    or ``'soft++'``) and ``solver`` (``'newton_closed_form'`` or ``'exact'``).

    Cholesky (SOFT's ``'exact'``): m^3/3 for the factor and 2m^3/3 to invert
    it. An eigendecomposition (SOFT++'s ``'exact'``, and
    ``'newton_closed_form'``): about 4m^3/3 to reduce to tridiagonal form,
    m^3 to accumulate the eigenvectors and m^3 to multiply them back.
    """
    factor = 1 if (variant, solver) == ('soft', 'exact') else 10 / 3

    def handle(inputs: List[Any], outputs: List[Any]) -> int:
        *batch, size, _ = get_shape(inputs[0])
        return int(factor * prod(batch) * size**3)

    return handle


def extra_flop_handles(model) -> Dict[str, Handle]:
    """Operator name -> handle (None: known, not counted) to add to a
    FlopAnalyzer for ``model``. The inverse handle is configured from its
    :class:`~mmsoft.models.soft.SoftAttention` modules, whose solvers other
    than ``'newton'`` must then all share one variant and solver."""
    from mmsoft.models.soft import SoftAttention
    handles = dict.fromkeys(ELEMENTWISE_OPS, elementwise_flops)
    handles.update(dict.fromkeys(  # one FLOP per input element
        REDUCTION_OPS, lambda inputs, outputs: elementwise_flops(outputs, inputs)))
    handles.update(dict.fromkeys(NOT_COUNTED_OPS))
    handles['aten::scaled_dot_product_attention'] = sdpa_flops
    handles['aten::baddbmm'] = baddbmm_flops
    settings = {(m.variant, m.solver) for m in model.modules()
                if isinstance(m, SoftAttention) and m.solver != 'newton'}
    if len(settings) > 1:
        raise ValueError(f'SOFT attentions of one model use several inverse '
                         f'settings {sorted(settings)}; the FLOP handle needs one.')
    if settings:
        handle = kernel_inverse_handle(*settings.pop())
        for function in INVERSE_FUNCTIONS:
            handles[f'prim::PythonOp.{function}'] = handle
    return handles


def count_flops(model, inputs):
    """Total FLOPs (multiply-adds) of ``model(*inputs)`` (a model in eval
    mode) and the FlopAnalyzer, with :func:`extra_flop_handles`."""
    from mmengine.analysis import FlopAnalyzer
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**extra_flop_handles(model))
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer.total(), analyzer
