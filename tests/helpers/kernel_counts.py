"""The kernels a training step launches on a GPU, counted without one.

A model moved to the ``meta`` device runs its forward and backward on
tensors that have shapes but no data. Every operation still passes through
torch's dispatcher, where :class:`KernelCounter` counts those that launch a
kernel on a GPU (views, allocations and ``detach`` launch none). mmsoft's
layers choose their path by ``device.type == 'cpu'``: on ``meta`` they take
the path a GPU runs (the Newton iteration, whole-chunk kernel products), so
the count is that of the GPU's training step. A host sync cannot hide here:
reading a ``meta`` tensor's value raises.

``python tests/helpers/kernel_counts.py OUT.json`` adds this torch release's
counts of :data:`CASES` to the record at ``OUT.json``;
``tests/test_kernel_counts.py`` compares the code with the record.
"""
import json
import sys
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from mmsoft.models import SOFT, UFOViT
from mmsoft.ops import LAUNCHES

#: Operations that launch no kernel: allocations, aliases and the reshapes
#: that torch does not mark as views.
NO_KERNEL = frozenset((
    'detach', 'alias', 'lift_fresh', '_unsafe_view', '_reshape_alias', 'empty',
    'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided'))


class KernelCounter(TorchDispatchMode):
    """Counts, by operation name, the dispatched operations that launch a kernel.

    An operation of mmsoft's (``mmsoft::<name>``) counts as the kernels its
    CUDA implementation launches (:data:`mmsoft.ops.LAUNCHES`). Unless
    ``count_cpu``, one on CPU tensors alone counts as none: where the model
    runs on the ``meta`` device, it makes a layer's constants on the host."""

    def __init__(self, count_cpu: bool = False):
        super().__init__()
        self.counts = Counter()
        self.count_cpu = count_cpu

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        tensors = [value for value in pytree.tree_flatten((args, kwargs, out))[0]
                   if isinstance(value, torch.Tensor)]
        on_cpu = all(tensor.device.type == 'cpu' for tensor in tensors)
        if on_cpu and not self.count_cpu:
            return out
        if func.namespace == 'mmsoft':
            self.counts[name] += LAUNCHES[name]
        elif not func.is_view and name not in NO_KERNEL:
            self.counts[name] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def training_step_counts(model: torch.nn.Module, batch_shape: Sequence[int],
                         valid_shapes: Optional[Sequence] = None
                         ) -> Tuple[int, int, Counter]:
    """Kernels of one training step of ``model`` on ``meta`` images.

    The step is the forward of the four maps (mmsoft's models through
    ``forward_intermediates`` with the batch's ``valid_shapes``, a peer's
    ``features_only`` model called on the padded batch) and the backward of
    the sum of their means. The optimizer's step is left out: a few foreach
    kernels, the same for every model.

    Returns:
        tuple: The forward's count, the whole step's, and the step's counts
        by operation.
    """
    model = model.to('meta').train()
    images = torch.empty(*batch_shape, device='meta')
    counter = KernelCounter()
    with counter:
        if isinstance(model, (SOFT, UFOViT)):
            maps = model.forward_intermediates(images, intermediates_only=True,
                                               valid_shapes=valid_shapes)
        else:
            maps = model(images)
        forward = counter.total
        sum(feature.float().mean() for feature in maps).backward()
    return forward, counter.total, counter.counts


def _mmsoft(family: str, arch: str, drop_path_rate: float) -> Callable:
    def build():
        if family == 'ufo-vit':
            return UFOViT(arch, drop_path_rate=drop_path_rate)
        # The SOFT++ configs' settings (configs/soft/_base_/soft++.py).
        return SOFT(arch, variant='soft++', solver='newton_closed_form',
                    newton_iters=20, max_bottleneck_tokens=256,
                    drop_path_rate=drop_path_rate)
    return build


def _timm_swin() -> torch.nn.Module:
    import functools

    import timm
    from timm.layers import PatchEmbed
    return timm.create_model(
        'swin_tiny_patch4_window7_224', features_only=True, strict_img_size=False,
        drop_path_rate=0.2,
        embed_layer=functools.partial(PatchEmbed, dynamic_img_pad=True))


def _timm_pvt_v2_b2() -> torch.nn.Module:
    import timm
    return timm.create_model('pvt_v2_b2', features_only=True, drop_path_rate=0.1)


#: The models of the COCO configs, and timm's Swin-T and PVTv2-b2 as the
#: yardsticks (SOFT++-tiny and UFO-ViT-small against Swin-T, SOFT++-small
#: against PVTv2-b2).
MODELS: Dict[str, Callable[[], torch.nn.Module]] = {
    'soft++-tiny': _mmsoft('soft++', 'tiny', 0.1),
    'soft++-small': _mmsoft('soft++', 'small', 0.2),
    'ufo-vit-small': _mmsoft('ufo-vit', 'small', 0.1),
    'swin-t (timm)': _timm_swin,
    'pvtv2-b2 (timm)': _timm_pvt_v2_b2,
}
#: Two COCO images as mmdet batches them (resized to 800 x 1067 and
#: 800 x 1201, padded to a multiple of 32), and one 800 x 1333 image.
INPUTS = {
    'batch 2': ((2, 3, 800, 1216), [(800, 1067), (800, 1201)]),
    'batch 1': ((1, 3, 800, 1344), None),
}
#: (case name, model, input): every model at batch 2, as mmdet trains, and
#: SOFT++-tiny and Swin-T at batch 1 too.
CASES: List[Tuple[str, str, str]] = [
    (f'{model}, {inputs}', model, inputs) for model in MODELS for inputs in INPUTS
    if inputs == 'batch 2' or model in ('soft++-tiny', 'swin-t (timm)')]


def inference_counts(model: torch.nn.Module, batch_shape: Sequence[int],
                     valid_shapes: Optional[Sequence] = None) -> int:
    """Kernels of one inference call (eval mode, no gradient) of ``model``, as
    :func:`training_step_counts` calls it."""
    model = model.to('meta').eval()
    images = torch.empty(*batch_shape, device='meta')
    with KernelCounter() as counter, torch.no_grad():
        if isinstance(model, (SOFT, UFOViT)):
            model.forward_intermediates(images, intermediates_only=True,
                                        valid_shapes=valid_shapes)
        else:
            model(images)
    return counter.total


def case_counts(model: str, inputs: str) -> Dict[str, int]:
    """The kernel counts of one case: its training step's forward and whole
    step, and an inference call."""
    batch_shape, valid_shapes = INPUTS[inputs]
    if model.endswith('(timm)'):  # the peers see the padded canvas
        valid_shapes = None
    with torch.device('meta'):  # no weights to initialise
        built = MODELS[model]()
    forward, step, _ = training_step_counts(built, batch_shape, valid_shapes)
    return dict(forward=forward, step=step,
                inference=inference_counts(built, batch_shape, valid_shapes))


def main(path: str) -> None:
    """Adds this torch release's counts of every case to the record at ``path``."""
    try:
        with open(path) as stream:
            record = json.load(stream)
    except FileNotFoundError:
        record = dict(releases={})
    release = '.'.join(torch.__version__.split('+')[0].split('.')[:2])
    counts = {}
    for name, model, inputs in CASES:
        try:
            counts[name] = case_counts(model, inputs)
        except ImportError as error:  # timm's yardsticks where timm is absent
            print(f'{name}: skipped ({error})')
            continue
        print(f'{name}: {counts[name]}')
    record['releases'][release] = counts
    with open(path, 'w') as stream:
        json.dump(record, stream, indent=1, sort_keys=True)
        stream.write('\n')


if __name__ == '__main__':
    main(sys.argv[1])
