"""Where a backbone's time goes: a per-operator and per-region profile.

One inference call or training step (forward and backward) of a backbone runs
under ``torch.profiler``. Every operator's own time (CPU time, or the time of
its CUDA kernels on a GPU) is attributed to

- its **operator class** (matrix products, convolutions, elementwise math,
  normalisation, layout copies, ...; :func:`operator_class`), and
- the **region** of the model that ran it: the innermost named region around
  it in forward (a module of :data:`MODULE_REGIONS`, or a function of
  :data:`FUNCTION_REGIONS`, entered as a ``record_function`` range while the
  profile runs). A backward operator belongs to the region of the forward
  operator that made its autograd node (matched by autograd's sequence
  number), so a region's time is its forward and backward time.

FLOPs are counted for the operators that do arithmetic in bulk: matrix
products, convolutions (forward and backward, from their shapes) and fused
attention kernels, 2 FLOPs per multiply-add; elementwise operators count 0.
Each region's rate (FLOPs / time) against the machine's measured matmul rate
says how close it is to its arithmetic.

Nothing here changes the model: the regions are entered by hooks and
wrappers that :func:`profile_regions` installs and removes.
"""
import contextlib
import functools
import importlib
import math
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function

#: Prefix of the ``record_function`` ranges that name regions.
REGION_PREFIX = 'mmsoft-region: '
#: Prefix of the autograd engine's range around one backward node.
BACKWARD_PREFIX = 'autograd::engine::evaluate_function: '
OTHER = 'other'

#: Module classes (by class name) -> region. The innermost region wins.
MODULE_REGIONS: Dict[str, str] = {
    # stems and patch embeddings: mmsoft, timm's Swin, PVTv2 and XCiT
    'ConvPatchEmbed': 'stem and patch embedding',
    'PatchEmbed': 'stem and patch embedding',
    'OverlapPatchEmbed': 'stem and patch embedding',
    'PatchMerging': 'stem and patch embedding',
    'ConvPatchEmbedding': 'stem and patch embedding',
    # attention
    'SoftAttention': 'attention (other)',
    'GlobalSoftmaxAttention': 'softmax attention',
    # UFO-ViT's QKV and output projections run inside the module (its XNorm
    # attention is a function region of its own)
    'UFOAttention': 'attention projections',
    'WindowAttention': 'softmax attention',
    'Attention': 'softmax attention',
    'XCA': 'softmax attention',
    # MLPs
    'MLP': 'MLP', 'Mlp': 'MLP', 'MlpWithDepthwiseConv': 'MLP',
    # norms
    'LayerNorm': 'norms', 'LayerNorm2d': 'norms', 'BatchNorm2d': 'norms',
    # blocks and stages: what is not in their parts
    'SoftBlock': 'residuals and layout', 'SoftmaxBlock': 'residuals and layout',
    'UFOBlock': 'residuals and layout', 'SwinTransformerBlock': 'residuals and layout',
    'Block': 'residuals and layout', 'XCABlock': 'residuals and layout',
    'SoftStage': 'residuals and layout', 'SwinTransformerStage': 'residuals and layout',
    'PyramidVisionTransformerStage': 'residuals and layout',
    # UFO-ViT's and XCiT's own parts
    'LocalPatchInteraction': 'local patch interaction', 'LPI': 'local patch interaction',
    'FeaturePyramidAdapter': 'feature pyramid', 'StridePyramid': 'feature pyramid',
    'FourierPositionEncoding': 'position embedding',
    'PositionalEncodingFourier': 'position embedding',
}
#: Linear layers of an attention module (by attribute name) -> region.
ATTENTION_PARTS: Dict[str, str] = {
    **{name: 'attention projections' for name in (
        'q', 'k', 'v', 'kv', 'qkv', 'proj', 'q_proj', 'v_proj', 'out_proj')},
    # PVTv2's spatial reduction of keys and values
    'sr': 'spatial reduction', 'pool': 'spatial reduction', 'norm': 'spatial reduction',
}
#: Functions and methods (dotted names) -> region; their callers' references
#: are wrapped too.
FUNCTION_REGIONS: Dict[str, str] = {
    'mmsoft.models.memory_efficient.layer_norm_mlp': 'MLP',
    'mmsoft.models.soft.linear_to_map': 'attention projections',
    'mmsoft.models.soft.SoftAttention.bottleneck_tokens': 'bottleneck pooling',
    'mmsoft.models.soft.SoftAttention.output': 'local convolution',
    'mmsoft.models.soft.SoftStage.position_embeddings': 'position embedding',
    'mmsoft.models.soft.gaussian_kernel': 'Gaussian kernel',
    'mmsoft.models.soft.kernel_of_operands': 'Gaussian kernel',
    'mmsoft.models.soft.kernel_operands': 'Gaussian kernel',
    'mmsoft.models.soft.kernel_inverse': 'kernel inverse',
    'mmsoft.models.soft.scaled_both_sides': 'kernel inverse',
    'mmsoft.models.soft.kernel_products': 'kernel products',
    'mmsoft.models.memory_efficient.chunked_kernel_product': 'kernel products',
    'mmsoft.models.ufo_vit.ufo_attention': 'XNorm attention',
    'mmsoft.models.ufo_vit.FeaturePyramidAdapter.resample': 'feature pyramid',
    'mmsoft.models.common.tokens_to_map': 'stage outputs',
}
#: Regions in the order tables and plots list them.
REGION_ORDER = (
    'stem and patch embedding', 'position embedding', 'attention projections',
    'bottleneck pooling', 'Gaussian kernel', 'kernel inverse', 'kernel products',
    'local convolution', 'XNorm attention', 'spatial reduction',
    'softmax attention', 'attention (other)', 'MLP', 'norms',
    'local patch interaction', 'feature pyramid', 'residuals and layout',
    'stage outputs', OTHER)

#: Operator classes: (class, operator names) in the order they are tried.
OPERATOR_CLASSES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('matrix products', ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm',
                         'aten::_addmm_activation', 'aten::addbmm')),
    ('convolutions', ('aten::mkldnn_convolution', 'aten::convolution_backward',
                      'aten::_slow_conv2d_forward', 'aten::_slow_conv2d_backward',
                      'aten::cudnn_convolution', 'aten::_convolution',
                      'aten::convolution', 'aten::thnn_conv2d',
                      'aten::slow_conv_transpose2d', 'aten::mkldnn_convolution_backward',
                      'aten::cudnn_convolution_transpose',
                      'aten::_conv_depthwise2d', 'aten::conv_depthwise2d_backward',
                      'aten::_slow_conv2d_backward')),
    ('fused attention', ()),
    ('linear algebra', ('aten::cholesky', 'aten::cholesky_inverse')),
    ('normalisation', ('aten::native_layer_norm', 'aten::native_batch_norm',
                       'aten::_native_batch_norm_legit', 'aten::batch_norm',
                       'aten::native_layer_norm_backward',
                       'aten::native_batch_norm_backward', 'aten::layer_norm',
                       'aten::_batch_norm', 'aten::cudnn_batch_norm')),
    ('layout copies', ('aten::copy_', 'aten::clone', 'aten::contiguous',
                       'aten::_to_copy', 'aten::cat', 'aten::constant_pad_nd',
                       'aten::index', 'aten::index_put', 'aten::repeat',
                       'aten::roll', 'aten::stack', 'aten::_unsafe_view',
                       'aten::reshape', 'aten::as_strided_scatter',
                       'aten::slice_backward', 'aten::select_backward',
                       'aten::narrow_copy', 'aten::repeat_interleave',
                       'aten::im2col', 'aten::col2im', 'aten::gather',
                       'aten::scatter', 'aten::masked_scatter', 'aten::flip',
                       'aten::unfold')),
    ('reductions', ('aten::sum', 'aten::mean', 'aten::amax', 'aten::max',
                    'aten::linalg_vector_norm', 'aten::norm', 'aten::var_mean',
                    'aten::std', 'aten::var', 'aten::_softmax', 'aten::softmax',
                    'aten::_softmax_backward_data', 'aten::max_pool2d',
                    'aten::max_pool2d_with_indices', 'aten::avg_pool2d',
                    'aten::_adaptive_avg_pool2d', 'aten::adaptive_max_pool2d',
                    'aten::_adaptive_avg_pool2d_backward', 'aten::avg_pool2d_backward',
                    'aten::max_pool2d_with_indices_backward',
                    'aten::upsample_bilinear2d', 'aten::upsample_bilinear2d_backward')),
    ('allocation and bookkeeping', ('aten::empty', 'aten::zeros', 'aten::ones',
                                    'aten::fill_', 'aten::zero_', 'aten::full',
                                    'aten::resize_', 'aten::set_',
                                    'torch::autograd::AccumulateGrad',
                                    'aten::detach', 'detach', 'aten::lift_fresh',
                                    'aten::new_', 'aten::empty_like',
                                    'aten::zeros_like', 'aten::ones_like')),
)
ELEMENTWISE = 'elementwise math'
CLASS_ORDER = tuple(name for name, _ in OPERATOR_CLASSES[:6]) + (
    ELEMENTWISE, 'reductions', 'allocation and bookkeeping', 'Python and dispatch')


def operator_class(name: str) -> str:
    """The operator class of a profiler event's name: one of
    :data:`OPERATOR_CLASSES`, elementwise math for any other ``aten::``
    operator, Python and dispatch for the rest."""
    for klass, names in OPERATOR_CLASSES:
        if name in names:
            return klass
    if name.startswith(('aten::_scaled_dot_product', 'aten::_flash_attention',
                        'aten::_efficient_attention')):
        return 'fused attention'
    if name.startswith(('aten::_linalg', 'aten::linalg_')):
        return 'linear algebra'
    if name.startswith('aten::'):
        return ELEMENTWISE
    return 'Python and dispatch'


# --- FLOPs of one operator, from its recorded shapes
def _prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)


def _matmul_flops(name: str, shapes: List[List[int]]) -> int:
    if name in ('aten::mm', 'aten::addmm', 'aten::_addmm_activation'):
        a, b = (shapes[0], shapes[1]) if name == 'aten::mm' else (shapes[1], shapes[2])
        return 2 * a[0] * a[1] * b[-1]
    if name in ('aten::bmm', 'aten::baddbmm'):
        a, b = (shapes[0], shapes[1]) if name == 'aten::bmm' else (shapes[1], shapes[2])
        return 2 * a[0] * a[1] * a[2] * b[-1]
    return 0


def _conv_output(shape: List[int], weight: List[int], stride, padding, dilation,
                 transposed: bool, output_padding) -> List[int]:
    spatial = []
    for i, size in enumerate(shape[2:]):
        kernel = weight[2 + i]
        if transposed:
            spatial.append((size - 1) * stride[i] - 2 * padding[i]
                           + dilation[i] * (kernel - 1) + output_padding[i] + 1)
        else:
            spatial.append((size + 2 * padding[i] - dilation[i] * (kernel - 1) - 1)
                           // stride[i] + 1)
    return spatial


def _conv_flops(name: str, shapes: List[List[int]], concrete: list) -> int:
    """Convolution forward (``aten::convolution``) or backward
    (``aten::convolution_backward``): 2 x the multiply-adds of each product."""
    if name == 'aten::convolution':
        inputs, weight = shapes[0], shapes[1]
        stride, padding, dilation, transposed, output_padding, groups = concrete[3:9]
        if transposed:  # each input cell meets every weight of its group
            return 2 * _prod(inputs) * _prod(weight[1:])
        spatial = _conv_output(inputs, weight, stride, padding, dilation, transposed,
                               output_padding)
        return 2 * inputs[0] * weight[0] * _prod(spatial) * _prod(weight[1:])
    if name == 'aten::convolution_backward':
        grad_out, inputs, weight = shapes[0], shapes[1], shapes[2]
        transposed, mask = concrete[7], concrete[10]
        per_product = 2 * _prod(inputs if transposed else grad_out) * _prod(weight[1:])
        return per_product * sum(bool(flag) for flag in mask[:2])
    return 0


def _attention_flops(name: str, shapes: List[List[int]]) -> int:
    """Fused attention: ``Q K^T`` and ``P V`` forward, twice as much backward
    (whose first operand is the output's gradient, then Q, K, V)."""
    backward = name.endswith('_backward')
    operands = shapes[1:4] if backward else shapes[:3]
    if len(operands) < 3 or any(len(shape) != 4 for shape in operands):
        return 0
    query, key, value = operands
    batch, heads, tokens, dims = query
    keys, value_dims = key[-2], value[-1]
    forward = 2 * batch * heads * tokens * keys * (dims + value_dims)
    return 2 * forward if backward else forward


def operator_flops(event) -> int:
    """FLOPs of one profiler event (0 for operators that are not counted)."""
    name = event.name
    shapes = event.input_shapes or []
    concrete = getattr(event, 'concrete_inputs', None) or []
    try:
        if name in ('aten::convolution', 'aten::convolution_backward'):
            return _conv_flops(name, shapes, concrete)
        if name.startswith('aten::_scaled_dot_product'):
            return _attention_flops(name, shapes)
        return _matmul_flops(name, shapes)
    except (IndexError, TypeError, ValueError):
        return 0


# --- Regions: hooks and wrappers
def resolve(dotted: str) -> Tuple[object, str, Callable]:
    """(owner, attribute, function) of ``module.function`` or
    ``module.Class.method``."""
    parts = dotted.split('.')
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module('.'.join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1], getattr(owner, parts[-1])
    raise ImportError(f'{dotted!r} names no function')


def check_function_regions(table: Dict[str, str] = FUNCTION_REGIONS) -> None:
    """Raises ``ImportError`` or ``AttributeError`` for a name of ``table``
    that does not resolve."""
    for dotted in table:
        resolve(dotted)


def replace_references(dotted: str, replacement: Callable
                       ) -> List[Tuple[object, str, Callable]]:
    """Puts ``replacement`` in place of the function or method ``dotted``, and
    of every reference to that function in ``mmsoft``'s modules.

    Returns:
        list: ``(owner, attribute, original)`` of each replaced reference, to
        put back with ``setattr``.
    """
    owner, attribute, function = resolve(dotted)
    owners = [(owner, attribute)]
    if not isinstance(owner, type):  # a module's function: its importers too
        owners += [(module, key) for name, module in list(sys.modules.items())
                   if name.startswith('mmsoft') and module is not owner
                   for key, value in list(vars(module).items()) if value is function]
    replaced = []
    for target, key in owners:
        replaced.append((target, key, getattr(target, key)))
        setattr(target, key, replacement)
    return replaced


def _wrapped(function: Callable, region: str) -> Callable:
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with record_function(REGION_PREFIX + region):
            return function(*args, **kwargs)
    wrapper.__wrapped_region__ = region
    return wrapper


def _module_region(name: str, module: nn.Module,
                   parent: Optional[nn.Module]) -> Optional[str]:
    attribute = name.rsplit('.', 1)[-1]
    if parent is not None and type(parent).__name__ in (
            'SoftAttention', 'UFOAttention', 'GlobalSoftmaxAttention', 'Attention',
            'WindowAttention', 'XCA') and attribute in ATTENTION_PARTS:
        return ATTENTION_PARTS[attribute]
    return MODULE_REGIONS.get(type(module).__name__)


@contextlib.contextmanager
def profile_regions(model: nn.Module) -> Iterator[None]:
    """Enters a region range around each module of :data:`MODULE_REGIONS`
    (and the parts of :data:`ATTENTION_PARTS`) and each function of
    :data:`FUNCTION_REGIONS` while the block runs."""
    handles, patched = [], []
    parents = {child: module for module in model.modules()
               for child in module.children()}
    for name, module in model.named_modules():
        region = _module_region(name, module, parents.get(module))
        if region is None:
            continue
        ranges: List[record_function] = []

        def enter(_module, _args, region=region, ranges=ranges):
            ranges.append(record_function(REGION_PREFIX + region))
            ranges[-1].__enter__()

        def leave(_module, _args, _out, ranges=ranges):
            ranges.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    missing = []
    for dotted, region in FUNCTION_REGIONS.items():
        try:
            _, _, function = resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)  # an older mmsoft: the region stays unnamed
            continue
        patched += replace_references(dotted, _wrapped(function, region))
    if missing:
        print(f'op_profile: no region for {", ".join(missing)} (not in this mmsoft)',
              file=sys.stderr)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for target, key, original in reversed(patched):
            setattr(target, key, original)


# --- Attribution
def _self_time_us(event, device: str) -> float:
    if device == 'cuda':
        return float(getattr(event, 'self_device_time_total', 0.)
                     or getattr(event, 'self_cuda_time_total', 0.))
    return float(event.self_cpu_time_total)


def attribute(events, device: str = 'cpu') -> Dict[str, Dict]:
    """Time (us) and FLOPs per region, per operator class and per operator.

    Args:
        events: ``torch.profiler.profile().events()``.
        device (str): ``'cpu'`` (CPU self time) or ``'cuda'`` (kernel time).

    Returns:
        dict: ``regions``, ``classes``, ``operators``: name -> {``us``,
        ``flops``, ``kernels``} (``kernels``: the GPU kernels, copies and
        memsets the operators launched; 0 on the CPU); ``region_classes``:
        region -> class -> us.
    """
    forward_by_seq: Dict[Tuple[int, int], object] = {}
    for event in events:
        if event.sequence_nr is None or event.sequence_nr < 0:
            continue
        if event.name.startswith(BACKWARD_PREFIX) or event.name.endswith('Backward0') \
                or event.name.endswith('Backward'):
            continue
        key = (event.thread, event.sequence_nr)
        known = forward_by_seq.get(key)
        if known is None or event.time_range.start < known.time_range.start:
            forward_by_seq[key] = event
    memo: Dict[int, str] = {}

    def region_of(event, depth: int = 0) -> str:
        if id(event) in memo:
            return memo[id(event)]
        found, node = OTHER, event
        while node is not None:
            if node.name.startswith(REGION_PREFIX):
                found = node.name[len(REGION_PREFIX):]
                break
            if node.name.startswith(BACKWARD_PREFIX):
                forward = forward_by_seq.get((node.fwd_thread, node.sequence_nr))
                if forward is not None and depth < 8:
                    found = region_of(forward, depth + 1)
                break
            node = node.cpu_parent
        memo[id(event)] = found
        return found

    regions = defaultdict(lambda: dict(us=0., flops=0, kernels=0))
    classes = defaultdict(lambda: dict(us=0., flops=0, kernels=0))
    operators = defaultdict(lambda: dict(us=0., flops=0, kernels=0, calls=0))
    region_classes = defaultdict(lambda: defaultdict(float))
    for event in events:
        if event.name.startswith(REGION_PREFIX) or event.device_type != DeviceType.CPU:
            continue
        region = region_of(event)
        klass = operator_class(event.name)
        spent = _self_time_us(event, device)
        flops = operator_flops(event)
        kernels = len(getattr(event, 'kernels', None) or ())  # launched on a GPU
        for table, key in ((regions, region), (classes, klass), (operators, event.name)):
            table[key]['us'] += spent
            table[key]['flops'] += flops
            table[key]['kernels'] += kernels
        operators[event.name]['calls'] += 1
        region_classes[region][klass] += spent
    return dict(regions=dict(regions), classes=dict(classes), operators=dict(operators),
                region_classes={key: dict(value) for key, value in region_classes.items()})


# --- One profile
def profile_tables(model: nn.Module, step: Callable[[], None],
                   device: torch.device) -> Dict:
    """One ``step()`` under ``torch.profiler`` with the regions of ``model``
    named: ``regions`` and ``classes`` (name -> ``ms``, ``gflop``,
    ``kernels``) and ``profiled_ms``, the step's wall time under the profiler."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    with profile_regions(model):
        with profile(activities=activities, record_shapes=True) as prof:
            began = time.perf_counter()
            step()
            if device.type == 'cuda':
                torch.cuda.synchronize(device)
            profiled = (time.perf_counter() - began) * 1e3
    tables = attribute(prof.events(), device.type)
    return dict(profiled_ms=profiled, **{
        table: {name: dict(ms=entry['us'] / 1e3, gflop=entry['flops'] / 1e9,
                           kernels=entry['kernels'])
                for name, entry in tables[table].items()}
        for table in ('regions', 'classes')})
