"""Where a backbone's time goes: a profile by operator class and by region.

Each operator's own time counts for its operator class and for the innermost
region around it (a module of :data:`MODULE_REGIONS` or a function of
:data:`FUNCTION_REGIONS`); a backward operator counts for the region of the
forward operator that made its autograd node. FLOPs: 2 per multiply-add of
matrix products, convolutions and fused attention.
"""
import contextlib
import functools
import math
import pkgutil
import re
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, Iterator, List, Tuple

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function

#: Prefix of the ``record_function`` ranges that name regions.
REGION_PREFIX = 'mmsoft-region: '
#: Prefix of the autograd engine's range around one backward node.
BACKWARD_PREFIX = 'autograd::engine::evaluate_function: '
OTHER = 'other'

#: Module classes (mmsoft's, timm's and mmdet's) -> region, by class name.
MODULE_REGIONS: Dict[str, str] = {
    **dict.fromkeys(('ConvPatchEmbed', 'PatchEmbed', 'OverlapPatchEmbed',
                     'PatchMerging', 'ConvPatchEmbedding'), 'stem and patch embedding'),
    **dict.fromkeys(('GlobalSoftmaxAttention', 'WindowAttention', 'Attention', 'XCA'),
                    'softmax attention'),
    'SoftAttention': 'attention (other)',
    # UFO-ViT's projections run in the module, its XNorm attention in a function
    'UFOAttention': 'attention projections',
    **dict.fromkeys(('MLP', 'Mlp', 'MlpWithDepthwiseConv'), 'MLP'),
    **dict.fromkeys(('LayerNorm', 'LayerNorm2d', 'BatchNorm2d'), 'norms'),
    # blocks and stages: what is not in their parts
    **dict.fromkeys(('SoftBlock', 'SoftmaxBlock', 'UFOBlock', 'SwinTransformerBlock',
                     'Block', 'XCABlock', 'SoftStage', 'SwinTransformerStage',
                     'PyramidVisionTransformerStage'), 'residuals and layout'),
    **dict.fromkeys(('LocalPatchInteraction', 'LPI'), 'local patch interaction'),
    **dict.fromkeys(('FeaturePyramidAdapter', 'StridePyramid'), 'feature pyramid'),
    **dict.fromkeys(('FourierPositionEncoding', 'PositionalEncodingFourier'),
                    'position embedding'),
}
#: The layers of an attention module (a region of :data:`MODULE_REGIONS` that
#: names attention), by attribute name -> region.
ATTENTION_PARTS: Dict[str, str] = {
    **dict.fromkeys(('q', 'k', 'v', 'kv', 'qkv', 'proj', 'q_proj', 'v_proj',
                     'out_proj'), 'attention projections'),
    # PVTv2's spatial reduction of keys and values
    **dict.fromkeys(('sr', 'pool', 'norm'), 'spatial reduction'),
}
#: Functions and methods (dotted names) -> region; the references to them in
#: mmsoft's modules are wrapped too.
FUNCTION_REGIONS: Dict[str, str] = {
    'mmsoft.models.soft.linear_to_map': 'attention projections',
    'mmsoft.models.soft.SoftAttention.bottleneck_tokens': 'bottleneck pooling',
    'mmsoft.models.soft.SoftAttention.output': 'local convolution',
    'mmsoft.models.soft.SoftStage.position_embeddings': 'position embedding',
    'mmsoft.ops.soft.soft_attention': 'kernel products',
    'mmsoft.ops.kernel_inverse.soft_middle': 'kernel inverse',
    'mmsoft.ops.kernel_inverse.gaussian_kernel': 'Gaussian kernel',
    'mmsoft.ops.kernel_inverse.kernel_of_operands': 'Gaussian kernel',
    'mmsoft.ops.kernel_inverse.kernel_operands': 'Gaussian kernel',
    'mmsoft.ops.layer_norm.layer_norm_mlp': 'MLP',
    'mmsoft.ops.xnorm.xnorm_attention': 'XNorm attention',
    'mmsoft.ops.xnorm.ufo_attention': 'XNorm attention',
    'mmsoft.models.ufo_vit.FeaturePyramidAdapter.resample': 'feature pyramid',
    'mmsoft.models.common.tokens_to_map': 'stage outputs',
}
#: Operator classes: (class, pattern of ``aten::`` names), the first match wins;
#: any other ``aten::`` operator is elementwise math.
OPERATOR_CLASSES: Tuple[Tuple[str, str], ...] = (
    ('matrix products', r'(_addmm_activation|addmm|mm|bmm|baddbmm|addbmm)'),
    ('convolutions', r'.*conv.*|thnn_conv2d'),
    ('fused attention', r'_(scaled_dot_product|flash_attention|efficient_attention).*'),
    ('linear algebra', r'cholesky.*|_?linalg_(?!vector_norm).*'),
    ('normalisation', r'.*(layer|batch)_norm.*|_native_batch_norm_legit'),
    ('layout copies', r'copy_|clone|contiguous|_to_copy|cat|constant_pad_nd|index|'
                      r'index_put|repeat|repeat_interleave|roll|stack|_unsafe_view|'
                      r'reshape|as_strided_scatter|slice_backward|select_backward|'
                      r'narrow_copy|im2col|col2im|gather|scatter|masked_scatter|flip|'
                      r'unfold'),
    ('reductions', r'sum|mean|amax|max|linalg_vector_norm|norm|var_mean|std|var|'
                   r'_?softmax.*|.*pool2d.*|upsample_bilinear2d.*'),
    ('allocation and bookkeeping', r'empty|zeros|ones|fill_|zero_|full|resize_|set_|'
                                   r'detach|lift_fresh|new_.*|(empty|zeros|ones)_like'),
)


def operator_class(name: str) -> str:
    """The operator class of a profiler event's name (see
    :data:`OPERATOR_CLASSES`); what is not ``aten::`` is Python and dispatch."""
    if name in ('torch::autograd::AccumulateGrad', 'detach'):
        return 'allocation and bookkeeping'
    if not name.startswith('aten::'):
        return 'Python and dispatch'
    for klass, pattern in OPERATOR_CLASSES:
        if re.fullmatch(pattern, name[6:]):
            return klass
    return 'elementwise math'


def operator_flops(event) -> int:
    """FLOPs of one profiler event, from its recorded shapes: matrix
    products, convolutions and fused attention (0 for other operators)."""
    name, shapes = event.name, event.input_shapes or []
    concrete = getattr(event, 'concrete_inputs', None) or []
    try:
        if name in ('aten::mm', 'aten::bmm'):
            return 2 * math.prod(shapes[0]) * shapes[1][-1]
        if name in ('aten::addmm', 'aten::_addmm_activation', 'aten::baddbmm'):
            return 2 * math.prod(shapes[1]) * shapes[2][-1]
        if name == 'aten::convolution':  # 2 x output cells x weight cells (per group)
            inputs, weight = shapes[0], shapes[1]
            stride, padding, dilation, transposed = concrete[3:7]
            if transposed:  # each input cell meets every weight of its group
                return 2 * math.prod(inputs) * math.prod(weight[1:])
            cells = math.prod((size + 2 * pad - dil * (kernel - 1) - 1) // step + 1
                              for size, kernel, step, pad, dil in zip(
                                  inputs[2:], weight[2:], stride, padding, dilation))
            return 2 * inputs[0] * weight[0] * cells * math.prod(weight[1:])
        if name == 'aten::convolution_backward':  # input and weight gradients
            grad_out, inputs, weight = shapes[:3]
            transposed, mask = concrete[7], concrete[10]
            return (2 * math.prod(inputs if transposed else grad_out)
                    * math.prod(weight[1:]) * sum(map(bool, mask[:2])))
        if name.startswith('aten::_scaled_dot_product'):  # Q K^T and P V
            backward = name.endswith('_backward')
            query, key, value = shapes[1:4] if backward else shapes[:3]
            batch, heads, tokens, dims = query
            forward = 2 * batch * heads * tokens * key[-2] * (dims + value[-1])
            return 2 * forward if backward else forward
    except (IndexError, TypeError, ValueError):
        pass
    return 0


# --- Regions: hooks and wrappers
def wrap_function(dotted: str, region: str) -> List[Tuple[object, str, Callable]]:
    """Wraps the function or method ``dotted``, and every reference to that
    function in mmsoft's modules, in a region range; returns ``(owner,
    attribute, original)`` of each wrapped reference, to put back with
    ``setattr`` (ImportError or AttributeError where ``dotted`` names nothing)."""
    path, attribute = dotted.rsplit('.', 1)
    owner = pkgutil.resolve_name(path)
    function = getattr(owner, attribute)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with record_function(REGION_PREFIX + region):
            return function(*args, **kwargs)

    owners = [(owner, attribute)]
    if not isinstance(owner, type):  # a module's function: its importers too
        owners += [(module, key) for name, module in list(sys.modules.items())
                   if name.startswith('mmsoft') and module is not owner
                   for key, value in list(vars(module).items()) if value is function]
    replaced = [(target, key, getattr(target, key)) for target, key in owners]
    for target, key in owners:
        setattr(target, key, wrapper)
    return replaced


@contextlib.contextmanager
def profile_regions(model: nn.Module) -> Iterator[None]:
    """Enters a region range around each module of :data:`MODULE_REGIONS`
    (and the parts of :data:`ATTENTION_PARTS`) and each function of
    :data:`FUNCTION_REGIONS` while the block runs; a function this mmsoft
    lacks leaves its region unnamed, saying so."""
    handles, patched, missing = [], [], []
    parents = {child: module for module in model.modules()
               for child in module.children()}
    for name, module in model.named_modules():
        region = MODULE_REGIONS.get(type(module).__name__)
        if 'attention' in MODULE_REGIONS.get(type(parents.get(module)).__name__, ''):
            region = ATTENTION_PARTS.get(name.rsplit('.', 1)[-1], region)
        if region is None:
            continue
        ranges: List[record_function] = []  # open ranges, one per call running
        handles += [module.register_forward_pre_hook(
            lambda *_, name=REGION_PREFIX + region, ranges=ranges: ranges.append(
                record_function(name).__enter__())),
            module.register_forward_hook(  # hooks return None: nothing replaced
                lambda *_, ranges=ranges: ranges.pop().__exit__(None, None, None))]
    for dotted, region in FUNCTION_REGIONS.items():
        try:
            patched += wrap_function(dotted, region)
        except (ImportError, AttributeError):
            missing.append(dotted)
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
def attribute(events, device: str = 'cpu') -> Dict[str, Dict]:
    """Time (us), FLOPs, GPU kernels and calls per region, operator class and
    operator of ``torch.profiler.profile().events()`` (``regions``,
    ``classes``, ``operators``: name -> {``us``, ``flops``, ``kernels``,
    ``calls``}): each operator's self time on the CPU (``device='cpu'``) or
    its kernels' (``'cuda'``)."""
    forward_by_seq: Dict[Tuple[int, int], object] = {}
    for event in sorted(events, key=lambda e: e.time_range.start):  # the first wins
        if event.sequence_nr is not None and event.sequence_nr >= 0 and not \
                event.name.startswith(BACKWARD_PREFIX) and 'Backward' not in event.name:
            forward_by_seq.setdefault((event.thread, event.sequence_nr), event)

    found: Dict[int, str] = {}

    def region_of(event, depth: int = 0) -> str:
        if id(event) not in found:
            node, found[id(event)] = event, OTHER
            while node is not None:
                if node.name.startswith(REGION_PREFIX):
                    found[id(event)] = node.name[len(REGION_PREFIX):]
                    break
                if node.name.startswith(BACKWARD_PREFIX):
                    forward = forward_by_seq.get((node.fwd_thread, node.sequence_nr))
                    if forward is not None and depth < 8:
                        found[id(event)] = region_of(forward, depth + 1)
                    break
                node = node.cpu_parent
        return found[id(event)]

    tables = {table: defaultdict(lambda: dict(us=0., flops=0, kernels=0, calls=0))
              for table in ('regions', 'classes', 'operators')}
    for event in events:
        if event.name.startswith(REGION_PREFIX) or event.device_type != DeviceType.CPU:
            continue
        spent = float(event.self_cpu_time_total if device == 'cpu' else
                      getattr(event, 'self_device_time_total', 0.)
                      or getattr(event, 'self_cuda_time_total', 0.))
        flops = operator_flops(event)
        kernels = len(getattr(event, 'kernels', None) or ())  # launched on a GPU
        for table, key in (('regions', region_of(event)),
                           ('classes', operator_class(event.name)),
                           ('operators', event.name)):
            entry = tables[table][key]
            entry['us'] += spent
            entry['flops'] += flops
            entry['kernels'] += kernels
            entry['calls'] += 1
    return {table: dict(entries) for table, entries in tables.items()}


def profile_tables(model: nn.Module, step: Callable[[], None],
                   device: torch.device) -> Dict:
    """One ``step()`` under ``torch.profiler`` with the regions of ``model``
    named: ``regions`` and ``classes`` (name -> ``ms``, ``gflop``,
    ``kernels``) and ``profiled_ms``, the step's wall time under the profiler."""
    from torch.profiler import ProfilerActivity, profile
    cuda = [ProfilerActivity.CUDA] if device.type == 'cuda' else []
    with profile_regions(model), profile(activities=[ProfilerActivity.CPU, *cuda],
                                         record_shapes=True) as prof:
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
