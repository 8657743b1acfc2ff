"""ONNX export of any image model, and onnxruntime runs.

:func:`export_onnx` takes any module that maps an image batch (B, 3, H, W)
to tensors: a timm model (a classifier or ``features_only``), mmsoft's
plain models, an OpenMMLab backbone, or a config's backbone and neck
(:func:`build_feature_model`). What is exported is the function PyTorch
computes, in operators ONNX has:
the export formulation of the model's SOFT layers (their ``exportable``
flag), which
:func:`export_formulation` switches on while it exports:

* SOFT attention's ``solver='newton_closed_form'`` is exported as the
  Newton iteration, the same function (ONNX has no eigendecomposition);
  ``solver='exact'`` has no such formulation and is refused;
* the bottleneck cap and the position-embedding resize run on sizes that
  follow the traced input.

Tracers see each layer's plain operations
(:func:`mmsoft.models.common.is_tracing`).
The graph is traced with PyTorch's TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``) with dynamic batch, height and
width; :func:`verify_onnx` runs it in onnxruntime at several sizes next to
the eager model and reports the differences.
"""
import contextlib
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from typing import (Dict, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import torch
import torch.nn as nn

from ..models.soft import EXPORT_SOLVERS, SoftAttention, set_exportable
from ..utils.torch_compat import TORCH_VERSION, onnx_export_takes_dynamo

DEFAULT_OPSET = 17
INPUT_NAME = 'images'
MIN_INPUT_SIZE = 32


def _import_onnx_packages():
    """onnx and onnxruntime, or an ImportError saying how to install them."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise ImportError(f'{exc.name} is needed for ONNX export and inference: '
                          f'pip install -r requirements/deploy.txt') from exc
    return onnx, onnxruntime


# --------------------------------------------------------------------------
# The model: backbone (and neck) returning a tuple of maps
# --------------------------------------------------------------------------
class FeatureMaps(nn.Module):
    """A backbone, optionally followed by a neck, returning a tuple of maps.

    Args:
        backbone (nn.Module): Maps images (B, 3, H, W) to a tuple of maps.
        neck (nn.Module, optional): Maps that tuple to another (e.g. FPN).
    """

    def __init__(self, backbone: nn.Module, neck: Optional[nn.Module] = None):
        super().__init__()
        self.backbone = backbone
        self.neck = neck

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, 3, H, W) -> the backbone's (or the neck's) maps, (B, C_i, H_i, W_i)."""
        feats = self.backbone(images)
        if self.neck is not None:
            feats = self.neck(feats)
        return tuple(feats)


def load_feature_weights(model: FeatureMaps, checkpoint: str) -> None:
    """Loads a detector, segmentor or backbone checkpoint into ``model``.

    A checkpoint with ``backbone.*`` entries (a trained detector or
    segmentor) provides ``backbone.*`` and ``neck.*``; any other is taken as
    the backbone's own state dict.

    Args:
        model (FeatureMaps): The model to fill.
        checkpoint (str): Checkpoint file (loaded with ``weights_only=True``).

    Raises:
        ValueError: Weights of ``model`` are missing or have another shape
            (all listed by name; other checkpoint entries, e.g. the heads,
            are ignored).
    """
    from ..checkpoint import compare_state_dict, load_state_dict_safely
    state = load_state_dict_safely(checkpoint)
    if not any(key.startswith('backbone.') for key in state):
        state = {f'backbone.{key}': value for key, value in state.items()}
    result = compare_state_dict(state, model.state_dict())
    if not result.fits(allow_unexpected=True):
        raise ValueError(
            f'checkpoint {checkpoint} lacks {len(result.missing)} weights of the '
            f'exported model and has {len(result.mismatched)} in another shape '
            f'({result.describe(allow_unexpected=True)}); expected a checkpoint of '
            f'this config\'s model (or of its backbone alone, exported without the '
            f'neck).')
    model.load_state_dict(result.fitted)


@contextlib.contextmanager
def _quiet_mmengine_logger() -> Iterator[None]:
    """Silences mmengine's per-parameter initialisation report (INFO)."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_feature_model(config, checkpoint: Optional[str] = None,
                        with_neck: bool = False) -> FeatureMaps:
    """The backbone (and neck) of an mmdet or mmseg config, in eval mode.

    The whole model is built in the config's registry scope (its
    ``default_scope``), then its backbone and neck are kept.

    Args:
        config (str | mmengine.Config): The config or its path.
        checkpoint (str, optional): Weights (see :func:`load_feature_weights`).
            Without one, the backbone and neck are initialised from scratch
            (the config's ``init_cfg`` checkpoint is not loaded).
        with_neck (bool): Keep the config's neck after the backbone.

    Returns:
        FeatureMaps: In eval mode.

    Raises:
        ValueError: ``with_neck`` for a config without a neck.
    """
    from mmengine.config import Config

    from ..apis import build_model_from_config
    cfg = config if isinstance(config, Config) else Config.fromfile(config)
    full_model = build_model_from_config(cfg)
    neck = getattr(full_model, 'neck', None) if with_neck else None
    if with_neck and neck is None:
        raise ValueError(f'with_neck=True but the config {cfg.filename} has no '
                         f'model.neck; export the backbone alone (with_neck=False).')
    model = FeatureMaps(full_model.backbone, neck)
    if checkpoint is None:
        with _quiet_mmengine_logger():
            for part in (model.backbone, model.neck):
                if part is not None and hasattr(part, 'init_weights'):
                    part.init_weights()
    else:
        load_feature_weights(model, checkpoint)
    return model.eval()


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------
#: The oldest torch whose TorchScript exporter writes ``MaxPool2d(ceil_mode=
#: True)`` (UFO-ViT's stride-32 map) for a dynamic input size; torch 2.1's
#: stops with "Unsupported: ONNX export of operator get_pool_ceil_padding".
CEIL_MODE_POOL_EXPORT_TORCH = (2, 2)


def check_exportable(model: nn.Module) -> None:
    """Raises ``ValueError`` for a layer ONNX (or this torch's exporter)
    cannot express.

    Args:
        model (nn.Module): Any model; its :class:`SoftAttention` layers and
            ceil-mode max pools are checked.
    """
    for name, module in model.named_modules():
        if (isinstance(module, nn.MaxPool2d) and module.ceil_mode
                and TORCH_VERSION < CEIL_MODE_POOL_EXPORT_TORCH):
            raise ValueError(
                f'{name}: torch {torch.__version__} cannot export '
                f'MaxPool2d(ceil_mode=True) to ONNX with a dynamic input size '
                f'(its exporter has no get_pool_ceil_padding for unknown sizes); '
                f'export with torch >= '
                f'{".".join(map(str, CEIL_MODE_POOL_EXPORT_TORCH))}.')
        if isinstance(module, SoftAttention) and module.solver not in EXPORT_SOLVERS:
            raise ValueError(
                f'{name}: solver={module.solver!r} has no ONNX formulation (ONNX '
                f'has no Cholesky factorisation or eigendecomposition); build the '
                f'backbone with solver in {list(EXPORT_SOLVERS)} to export it '
                f"('newton_closed_form' is exported as the Newton iteration, the "
                f'same function).')


@contextlib.contextmanager
def export_formulation(model: nn.Module) -> Iterator[nn.Module]:
    """Switches ``model`` to its export formulation while the context lasts.

    Every module of ``model`` with an ``exportable`` flag computes its export formulation inside the context
    (:func:`~mmsoft.models.soft.set_exportable`) and its former one
    after it.

    Args:
        model (nn.Module): The model to export.

    Yields:
        nn.Module: ``model`` itself.

    Raises:
        ValueError: A layer has no ONNX formulation.
    """
    check_exportable(model)
    modules = [m for m in model.modules() if hasattr(m, 'exportable')]
    saved = [module.exportable for module in modules]
    set_exportable(model, True)
    try:
        yield model
    finally:
        for module, exportable in zip(modules, saved):
            module.exportable = exportable


def check_input_shape(name: str, shape: Sequence[int]) -> Tuple[int, int]:
    """Validates an (H, W) input size; returns it as a tuple.

    Raises:
        ValueError: Naming ``name``, the value and what is accepted.
    """
    shape = tuple(shape)
    if len(shape) != 2 or any(isinstance(side, bool) or not isinstance(side, int) or
                              side < MIN_INPUT_SIZE for side in shape):
        raise ValueError(f'{name}={shape!r} is invalid; expected (height, width), '
                         f'two integers >= {MIN_INPUT_SIZE}.')
    return shape


def output_tensors(outputs) -> Tuple[torch.Tensor, ...]:
    """A model's outputs as a flat tuple of tensors.

    Args:
        outputs: A tensor, or a tuple, list or mapping (its values in order;
            a transformers ``ModelOutput`` too) of them, nested or not.

    Raises:
        TypeError: Anything else, naming its type.
    """
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
    """A model whose outputs are returned as a flat tuple of tensors
    (:func:`output_tensors`), as ONNX's graph outputs are.

    Args:
        model (nn.Module): Maps (B, 3, H, W) images to tensors.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.training = model.training  # the exporter reads the mode here

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, 3, H, W) -> the model's output tensors."""
        return output_tensors(self.model(images))


def dynamic_axes(ranks: Sequence[int]) -> Dict[str, Dict[int, str]]:
    """Batch, height and width of the input, dynamic; of every output its
    batch, and its height and width (a 4-D map) or tokens (3-D)."""
    axes = {INPUT_NAME: {0: 'batch', 2: 'height', 3: 'width'}}
    for i, rank in enumerate(ranks):
        axes[f'out{i}'] = {0: 'batch'}
        if rank == 4:
            axes[f'out{i}'].update({2: f'height{i}', 3: f'width{i}'})
        elif rank == 3:
            axes[f'out{i}'][1] = f'tokens{i}'
    return axes


def export_onnx(model: nn.Module, path: str,
                sample_shape: Tuple[int, int] = (224, 224),
                opset: int = DEFAULT_OPSET) -> List[str]:
    """Exports ``model`` to ``path`` with dynamic batch, height and width.

    ``model`` is any module that maps images (B, 3, H, W) to a tensor, or to
    a tuple, list or mapping of tensors; the graph's outputs are those
    tensors in order (:func:`output_tensors`), ``out0``, ``out1``, ...
    The trace is taken on one random (1, 3, H, W) image of ``sample_shape``
    in :func:`export_formulation`. The graph's sizes follow the input, so the
    sample size does not matter; the tracer's warnings about Python values
    taken from sizes (the input checks) are silenced, and
    :func:`verify_onnx` is what shows the graph right at other sizes.

    Args:
        model (nn.Module): Maps (B, 3, H, W) images to tensors; eval mode.
        path (str): Output ``.onnx`` file (its folder is created).
        sample_shape (tuple[int, int]): (H, W) of the traced image.
            Default: (224, 224).
        opset (int): ONNX opset. Default: 17.

    Returns:
        list[str]: The output names, ``out0``, ``out1``, ...

    Raises:
        ValueError: Bad ``sample_shape``, or a layer ONNX cannot express.
        TypeError: An output that is not made of tensors.
    """
    sample_shape = check_input_shape('sample_shape', sample_shape)
    images = torch.randn(1, 3, *sample_shape)
    check_exportable(model)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    flat = FlatOutputs(model)
    with export_formulation(model), torch.no_grad():
        ranks = [output.dim() for output in flat(images)]
        names = [f'out{i}' for i in range(len(ranks))]
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            warnings.simplefilter('ignore', DeprecationWarning)
            # The TorchScript exporter: the default before torch 2.9, the only
            # one before 2.5 (which has no ``dynamo`` argument).
            exporter = dict(dynamo=False) if onnx_export_takes_dynamo() else {}
            torch.onnx.export(flat, (images, ), path, **exporter,
                              input_names=[INPUT_NAME], output_names=names,
                              dynamic_axes=dynamic_axes(ranks),
                              opset_version=opset, do_constant_folding=True)
    return names


def check_onnx_file(path: str) -> None:
    """Runs onnx's checker (with shape inference) on the file at ``path``."""
    onnx, _ = _import_onnx_packages()
    onnx.checker.check_model(path, full_check=True)


# --------------------------------------------------------------------------
# onnxruntime
# --------------------------------------------------------------------------
def onnxruntime_session(path: str, threads: Optional[int] = None,
                        profile_prefix: Optional[str] = None):
    """A CPU onnxruntime session for the file at ``path``.

    Args:
        path (str): The ``.onnx`` file.
        threads (int, optional): Intra-op threads (inter-op: 1, sequential
            execution). None lets onnxruntime choose.
        profile_prefix (str, optional): Turns profiling on, writing
            ``<prefix>_<date>.json``.

    Returns:
        onnxruntime.InferenceSession
    """
    _, ort = _import_onnx_packages()
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
    """Runs ``session`` on ``images`` (B, 3, H, W); returns its maps as tensors."""
    outputs = session.run(None, {INPUT_NAME: images.detach().cpu().numpy()})
    return tuple(torch.from_numpy(out) for out in outputs)


class OnnxRuntimeModel:
    """An onnxruntime session called like the module it was exported from.

    Args:
        session (onnxruntime.InferenceSession): The session.
    """

    def __init__(self, session):
        self.session = session

    def __call__(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, 3, H, W) -> the exported maps."""
        return run_onnxruntime(self.session, images)


def compare_outputs(reference: Sequence[torch.Tensor],
                    outputs: Sequence[torch.Tensor]) -> List[dict]:
    """Largest differences of ``outputs`` from ``reference``, map by map.

    Args:
        reference (Sequence[Tensor]): PyTorch's maps.
        outputs (Sequence[Tensor]): onnxruntime's maps, the same shapes.

    Returns:
        list[dict]: Per map: ``shape``, ``max_abs`` (largest absolute
        difference), ``scale`` (largest absolute reference value) and
        ``relative`` (``max_abs / scale``).

    Raises:
        ValueError: A different number of maps or a different shape.
    """
    if len(reference) != len(outputs):
        raise ValueError(f'onnxruntime returned {len(outputs)} maps; PyTorch '
                         f'returned {len(reference)}.')
    results = []
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        if ref.shape != out.shape:
            raise ValueError(f'map {i}: onnxruntime shape {tuple(out.shape)} differs '
                             f'from PyTorch shape {tuple(ref.shape)}.')
        max_abs = (ref.float() - out.float()).abs().max().item()
        scale = ref.float().abs().max().item()
        results.append(dict(shape=tuple(ref.shape), max_abs=max_abs, scale=scale,
                            relative=max_abs / scale if scale > 0 else max_abs))
    return results


def verify_onnx(model: nn.Module, session, shapes: Sequence[Tuple[int, int]],
                batch: int = 1, seed: int = 0) -> List[dict]:
    """onnxruntime against eager PyTorch on random images of several sizes.

    The eager model runs in its own formulation (e.g. the closed-form
    solver), not the exported one: this compares the functions.

    Args:
        model (nn.Module): The eager model, eval mode; its outputs are
            compared as :func:`output_tensors` flattens them.
        session (onnxruntime.InferenceSession): Its exported graph.
        shapes (Sequence[tuple[int, int]]): (H, W) sizes to run.
        batch (int): Images per run. Default: 1.
        seed (int): Seed of the random images. Default: 0.

    Returns:
        list[dict]: Per size: ``shape`` and ``maps`` (see
        :func:`compare_outputs`) and ``relative``, the largest over the maps.
    """
    generator = torch.Generator().manual_seed(seed)
    results = []
    for shape in shapes:
        shape = check_input_shape('shapes', shape)
        images = torch.randn(batch, 3, *shape, generator=generator)
        with torch.no_grad():
            reference = output_tensors(model(images))
        maps = compare_outputs(reference, run_onnxruntime(session, images))
        results.append(dict(shape=shape, maps=maps,
                            relative=max(m['relative'] for m in maps)))
    return results


def profile_onnxruntime(path: str, images: torch.Tensor, threads: int = 1,
                        runs: int = 1,
                        out_dir: Optional[str] = None) -> Dict[str, float]:
    """Seconds per run spent in each ONNX operator type, largest first.

    One untimed run, then ``runs`` profiled ones, in onnxruntime's profiler.

    Args:
        path (str): The ``.onnx`` file.
        images (Tensor): Input, (B, 3, H, W).
        threads (int): Intra-op threads. Default: 1.
        runs (int): Profiled runs. Default: 1.
        out_dir (str, optional): Folder where the profiler's JSON trace is
            kept; None: a temporary folder, removed afterwards.

    Returns:
        dict[str, float]: Operator type (e.g. ``MatMul``) to seconds per run.
    """
    run_onnxruntime(onnxruntime_session(path, threads), images)
    with contextlib.ExitStack() as stack:
        if out_dir is None:
            out_dir = stack.enter_context(tempfile.TemporaryDirectory())
        session = onnxruntime_session(
            path, threads, profile_prefix=os.path.join(out_dir, 'ort_profile'))
        for _ in range(runs):
            run_onnxruntime(session, images)
        with open(session.end_profiling()) as trace:
            events = json.load(trace)
    seconds = defaultdict(float)
    for event in events:
        if event.get('cat') == 'Node' and event['name'].endswith('_kernel_time'):
            seconds[event['args']['op_name']] += event['dur'] * 1e-6 / runs
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def _median_forward_seconds(model: nn.Module, images: torch.Tensor, warmup: int,
                             repeats: int) -> float:
    """Median wall time of ``repeats`` forwards without gradients, after
    ``warmup`` untimed ones."""
    seconds = []
    with torch.no_grad():
        for call in range(warmup + repeats):
            start = time.perf_counter()
            model(images)
            if call >= warmup:
                seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def compare_speed(model: nn.Module, path: str, shape: Tuple[int, int],
                  threads: int = 1, warmup: int = 1,
                  repeats: int = 3) -> Dict[str, float]:
    """Median time of one forward in eager PyTorch and in onnxruntime.

    Both run with ``threads`` threads on one random (1, 3, H, W) image.

    Args:
        model (nn.Module): The eager model, eval mode.
        path (str): Its ``.onnx`` file.
        shape (tuple[int, int]): (H, W).
        threads (int): Threads of both. Default: 1.
        warmup (int): Untimed calls first. Default: 1.
        repeats (int): Timed calls. Default: 3.

    Returns:
        dict: ``torch_seconds``, ``onnxruntime_seconds`` and ``speedup``
        (PyTorch's time over onnxruntime's).
    """
    images = torch.randn(1, 3, *check_input_shape('shape', shape))
    session = onnxruntime_session(path, threads)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch_seconds = _median_forward_seconds(model, images, warmup, repeats)
    finally:
        torch.set_num_threads(previous_threads)
    ort_seconds = _median_forward_seconds(OnnxRuntimeModel(session), images,
                                          warmup, repeats)
    return dict(torch_seconds=torch_seconds, onnxruntime_seconds=ort_seconds,
                speedup=torch_seconds / ort_seconds)


def describe_verification(results: List[dict]) -> List[str]:
    """One line per size and map of :func:`verify_onnx`'s results."""
    lines = []
    for result in results:
        height, width = result['shape']
        for i, item in enumerate(result['maps']):
            lines.append(f'{height}x{width} out{i} {item["shape"]}: max |diff| '
                         f'{item["max_abs"]:.3g}, output scale {item["scale"]:.3g}, '
                         f'relative {item["relative"]:.3g}')
    return lines


def largest_relative(results: List[dict]) -> Union[float, None]:
    """The largest relative difference over all sizes (None without results)."""
    return max((r['relative'] for r in results), default=None)
