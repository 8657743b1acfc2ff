"""ONNX export of any image model, and onnxruntime runs beside eager PyTorch.

The graph computes the model's function in operators ONNX has: every module
with an ``exportable`` flag runs its export formulation while it is traced
(SOFT's closed-form Newton solver as the iteration, the bottleneck cap on
traced sizes). PyTorch's TorchScript-based exporter writes it with dynamic
batch, height and width.
"""
import contextlib
import inspect
import os
import warnings
from typing import Dict, Iterator, List, Mapping, Sequence, Tuple

import torch
import torch.nn as nn

from ..models.soft import EXPORT_SOLVERS
from ..utils.torch_compat import TORCH_VERSION

DEFAULT_OPSET = 17
INPUT_NAME = 'images'
MIN_INPUT_SIZE = 32
#: The oldest torch whose exporter writes ``MaxPool2d(ceil_mode=True)`` (UFO-ViT's
#: stride-32 map) for a dynamic input size.
CEIL_MODE_POOL_EXPORT_TORCH = (2, 2)


def check_exportable(model: nn.Module) -> None:
    """Raises a ``ValueError`` naming a layer that ONNX, or this torch's
    exporter, cannot express."""
    for name, module in model.named_modules():
        if (isinstance(module, nn.MaxPool2d) and module.ceil_mode
                and TORCH_VERSION < CEIL_MODE_POOL_EXPORT_TORCH):
            raise ValueError(
                f'{name}: torch {torch.__version__} cannot export '
                f'MaxPool2d(ceil_mode=True) to ONNX with a dynamic input size '
                f'(its exporter has no get_pool_ceil_padding for unknown sizes); '
                f'export with torch >= '
                f'{".".join(map(str, CEIL_MODE_POOL_EXPORT_TORCH))}.')
        solver = getattr(module, 'solver', None)
        if hasattr(module, 'exportable') and solver not in (None, *EXPORT_SOLVERS):
            raise ValueError(
                f'{name}: solver={solver!r} has no ONNX formulation (ONNX '
                f'has no Cholesky factorisation or eigendecomposition); build the '
                f'backbone with solver in {list(EXPORT_SOLVERS)} to export it '
                f"('newton_closed_form' is exported as the Newton iteration, the "
                f'same function).')


@contextlib.contextmanager
def export_formulation(model: nn.Module) -> Iterator[nn.Module]:
    """Sets ``exportable = True`` on every module that has the flag while the
    context lasts; a ``ValueError`` for a layer ONNX cannot express."""
    check_exportable(model)
    modules = [module for module in model.modules() if hasattr(module, 'exportable')]
    saved = [module.exportable for module in modules]
    try:
        for module in modules:
            module.exportable = True
        yield model
    finally:
        for module, exportable in zip(modules, saved):
            module.exportable = exportable


def check_input_shape(name: str, shape: Sequence[int]) -> Tuple[int, int]:
    """``shape`` as (H, W); a ``ValueError`` unless two integers >= 32."""
    shape = tuple(shape)
    if len(shape) != 2 or any(isinstance(side, bool) or not isinstance(side, int) or
                              side < MIN_INPUT_SIZE for side in shape):
        raise ValueError(f'{name}={shape!r} is invalid; expected (height, width), '
                         f'two integers >= {MIN_INPUT_SIZE}.')
    return shape


def output_tensors(outputs) -> Tuple[torch.Tensor, ...]:
    """A tensor, or nested tuples, lists and mappings of them, as a flat tuple;
    a ``TypeError`` names anything else."""
    if isinstance(outputs, torch.Tensor):
        return (outputs, )
    if isinstance(outputs, Mapping):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return tuple(tensor for item in outputs for tensor in output_tensors(item))
    raise TypeError(f'a model output of type {type(outputs).__name__} cannot be '
                    f'exported; expected a tensor, or a tuple, list or mapping of '
                    f'tensors.')


class FlatOutputs(nn.Module):
    """``model`` returning :func:`output_tensors`, as ONNX's graph outputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.training = model.training  # the exporter reads the mode here

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return output_tensors(self.model(images))


def dynamic_axes(ranks: Sequence[int]) -> Dict[str, Dict[int, str]]:
    """The input's batch, height and width; each output's batch, and its height
    and width (4-D) or tokens (3-D)."""
    axes = {INPUT_NAME: {0: 'batch', 2: 'height', 3: 'width'}}
    for i, rank in enumerate(ranks):
        axes[f'out{i}'] = {0: 'batch'}
        if rank == 4:
            axes[f'out{i}'].update({2: f'height{i}', 3: f'width{i}'})
        elif rank == 3:
            axes[f'out{i}'][1] = f'tokens{i}'
    return axes


def export_onnx(model: nn.Module, path: str, sample_shape: Tuple[int, int] = (224, 224),
                opset: int = DEFAULT_OPSET) -> List[str]:
    """Exports ``model`` (eval mode; images to tensors) to ``path`` with dynamic
    batch, height and width, traced on one ``sample_shape`` image in
    :func:`export_formulation`; returns the output names ``out0``, ..."""
    images = torch.randn(1, 3, *check_input_shape('sample_shape', sample_shape))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    flat = FlatOutputs(model)
    with export_formulation(model), torch.no_grad():
        ranks = [output.dim() for output in flat(images)]
        names = [f'out{i}' for i in range(len(ranks))]
        # The TorchScript exporter: the default before torch 2.9, the only one
        # (without a ``dynamo`` argument) before 2.5.
        takes_dynamo = 'dynamo' in inspect.signature(torch.onnx.export).parameters
        exporter = dict(dynamo=False) if takes_dynamo else {}
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            warnings.simplefilter('ignore', DeprecationWarning)
            torch.onnx.export(flat, (images, ), path, **exporter,
                              input_names=[INPUT_NAME], output_names=names,
                              dynamic_axes=dynamic_axes(ranks),
                              opset_version=opset, do_constant_folding=True)
    return names


def _onnx_packages():
    """onnx and onnxruntime, or an ImportError saying how to install them."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise ImportError(f'{exc.name} is needed for ONNX export and inference: '
                          f'pip install -r requirements/deploy.txt') from exc
    return onnx, onnxruntime


def check_onnx_file(path: str) -> None:
    """onnx's checker, with shape inference, on the file at ``path``."""
    _onnx_packages()[0].checker.check_model(path, full_check=True)


def onnxruntime_session(path: str, threads: int = None, profile_prefix: str = None):
    """A CPU onnxruntime session of ``path`` with ``threads`` intra-op threads,
    profiling into ``<profile_prefix>_<date>.json`` when given."""
    ort = _onnx_packages()[1]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = threads
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def run_onnxruntime(session, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The session's outputs of ``images`` (B, 3, H, W), as tensors."""
    outputs = session.run(None, {INPUT_NAME: images.detach().cpu().numpy()})
    return tuple(torch.from_numpy(out) for out in outputs)


def verify_onnx(model: nn.Module, session, shapes: Sequence[Tuple[int, int]],
                batch: int = 1, seed: int = 0) -> List[dict]:
    """onnxruntime against the eager model (its own formulation) on random
    images of each (H, W) of ``shapes``: per size its ``shape``, per map the
    ``max_abs`` difference, ``scale`` and ``relative`` (``maps``), and the
    largest ``relative``. A ``ValueError`` for other outputs."""
    generator = torch.Generator().manual_seed(seed)
    results = []
    for shape in shapes:
        images = torch.randn(batch, 3, *check_input_shape('shapes', shape),
                             generator=generator)
        with torch.no_grad():
            reference = output_tensors(model(images))
        outputs = run_onnxruntime(session, images)
        if len(reference) != len(outputs):
            raise ValueError(f'onnxruntime returned {len(outputs)} maps; PyTorch '
                             f'returned {len(reference)}.')
        maps = []
        for i, (ref, out) in enumerate(zip(reference, outputs)):
            if ref.shape != out.shape:
                raise ValueError(f'map {i}: onnxruntime shape {tuple(out.shape)} '
                                 f'differs from PyTorch shape {tuple(ref.shape)}.')
            max_abs = (ref.float() - out.float()).abs().max().item()
            scale = ref.float().abs().max().item()
            maps.append(dict(shape=tuple(ref.shape), max_abs=max_abs, scale=scale,
                             relative=max_abs / scale if scale > 0 else max_abs))
        results.append(dict(shape=tuple(shape), maps=maps,
                            relative=max(m['relative'] for m in maps)))
    return results
