"""Float64 outputs and gradients of every backbone size, as random projections.

Two implementations of the same backbones compute the same function when,
for the same weights and images, their outputs and gradients agree. Each
case here builds a backbone in float64, fills every parameter and buffer
from a generator seeded by the tensor's name (so the weights do not depend
on the order or code of initialisation), runs one training-mode forward and
backward of two images, and reduces the four maps, the images' gradient and
the parameters' gradients to a few projections on seeded random directions.

``PYTHONPATH=CHECKOUT python tests/helpers/float64_reference.py OUT.json COMMIT
[CASE ...]`` adds the projections of the mmsoft at ``CHECKOUT`` (commit
``COMMIT``), for the torch release it runs with, to the record ``OUT.json``
(every case, or those named);
``tests/test_float64_reference.py`` compares the current code with it.
"""
import json
import sys
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch

#: SOFT's sizes: tiny and small whole; medium, large and huge with their
#: widths and heads on tiny's depths (deeper stacks repeat the same blocks).
SOFT_ARCHS = {
    'tiny': 'tiny', 'small': 'small',
    **{name: dict(embed_dims=dims, num_heads=heads, depths=[1, 2, 3, 2])
       for name, dims, heads in (('medium', [64, 128, 288, 512], [2, 4, 9, 16]),
                                 ('large', [64, 128, 320, 512], [2, 4, 10, 16]),
                                 ('huge', [64, 128, 352, 512], [2, 4, 11, 16]))},
}
#: UFO-ViT's sizes: tiny whole; small, medium and base with their widths and
#: heads at depth 4.
UFO_VIT_ARCHS = {
    'tiny': 'tiny',
    **{name: dict(embed_dims=dims, depth=4, num_heads=8)
       for name, dims in (('small', 304), ('medium', 416), ('base', 512))},
}
CONFIGS = dict(solver='newton_closed_form', max_bottleneck_tokens=256)
#: (name, family, arch, options, image (H, W), valid shapes or None).
CASES: List[Tuple[str, str, object, Dict, Tuple[int, int], Optional[Sequence]]] = [
    *[(f'{variant}-{name}', 'soft', arch, dict(variant=variant, **CONFIGS), (64, 96),
       None)
      for variant in ('soft', 'soft++') for name, arch in SOFT_ARCHS.items()],
    *[(f'{variant}-tiny-{solver}', 'soft', 'tiny',
       dict(variant=variant, solver=solver, max_bottleneck_tokens=256), (64, 96), None)
      for variant in ('soft', 'soft++') for solver in ('newton', 'exact')],
    ('soft++-tiny-chunked', 'soft', 'tiny',
     dict(variant='soft++', solver='newton_closed_form', max_bottleneck_tokens=8,
          kernel_chunk_tokens=100), (96, 136), None),
    ('soft++-tiny-plain', 'soft', 'tiny',
     dict(variant='soft++', memory_efficient=False, **CONFIGS), (64, 96), None),
    ('soft++-tiny-valid-regions', 'soft', 'tiny', dict(variant='soft++', **CONFIGS),
     (64, 96), [(64, 96), (48, 70)]),
    # The Newton iteration, as a GPU runs it, over regions whose bottlenecks
    # differ in size (6 and 4 tokens in stages 1 and 3).
    *[(f'{variant}-tiny-newton-valid-regions{suffix}', 'soft', 'tiny',
       dict(variant=variant, solver='newton', max_bottleneck_tokens=256, **options),
       (64, 96), [(64, 96), (64, 80)])
      for variant, suffix, options in (('soft++', '', {}), ('soft', '', {}),
                                       ('soft++', '-plain',
                                        dict(memory_efficient=False)))],
    *[(f'ufo-vit-{name}', 'ufo_vit', arch, {}, (64, 96), None)
      for name, arch in UFO_VIT_ARCHS.items()],
    ('ufo-vit-tiny-valid-regions', 'ufo_vit', 'tiny', {}, (64, 96),
     [(64, 96), (40, 72)]),
    ('ufo-vit-tiny-plain', 'ufo_vit', 'tiny', dict(memory_efficient=False), (64, 96),
     None),
]
PROJECTIONS = 4


def _generator(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def fill_deterministically(model: torch.nn.Module) -> None:
    """Every floating parameter and buffer from a generator seeded by its name:
    weights N(0, 1/fan_in), norm scales 1 + N(0, 0.1^2), biases and
    embeddings N(0, 0.02^2), running means N(0, 0.1^2), variances 1 + |N(0, 0.1^2)|."""
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=_generator(name),
                                dtype=torch.float64)
            if name.endswith('running_var'):
                value = 1 + 0.1 * noise.abs()
            elif name.endswith('running_mean'):
                value = 0.1 * noise
            elif tensor.dim() >= 2 and not name.endswith(('pos_embed', 'cls_token')):
                value = noise / tensor[0].numel()**0.5
            elif tensor.dim() == 1 and name.endswith('weight'):
                value = 1 + 0.1 * noise
            else:
                value = 0.02 * noise
            tensor.copy_(value)


def _projections(tensor: torch.Tensor, seed: str) -> List[float]:
    directions = torch.randn((PROJECTIONS, ) + tuple(tensor.shape),
                             generator=_generator(seed), dtype=torch.float64)
    return [float((direction * tensor).sum()) for direction in directions]


def _cosine_projections(tensor: torch.Tensor, seed: str) -> torch.Tensor:
    """Projections on ``cos(f_k i + p)`` over the flat index i: no random draw
    the size of ``tensor`` (the parameters' gradients are large)."""
    phase = zlib.crc32(seed.encode()) / 2**32 * 6.28
    index = torch.arange(tensor.numel(), dtype=torch.float64)
    flat = tensor.reshape(-1)
    return torch.stack([(torch.cos(index * (0.1 + 0.37 * k) + phase) * flat).sum()
                        for k in range(PROJECTIONS)])


def build(family: str, arch, options: Dict) -> torch.nn.Module:
    from mmsoft.models import SOFT, UFOViT
    cls = SOFT if family == 'soft' else UFOViT
    return cls(arch=arch, drop_path_rate=0., **options)


def case_projections(case) -> Dict[str, List[float]]:
    """Projections of the maps, the images' gradient and the parameters'
    gradients of one case of :data:`CASES`."""
    name, family, arch, options, (height, width), valid_shapes = case
    model = build(family, arch, options).double().train()
    fill_deterministically(model)
    images = torch.randn(2, 3, height, width, generator=_generator(name + '/images'),
                         dtype=torch.float64).requires_grad_()
    maps = model.forward_intermediates(images, intermediates_only=True,
                                       valid_shapes=valid_shapes)
    loss = sum((torch.randn(feature.shape, generator=_generator(f'{name}/loss{i}'),
                            dtype=torch.float64) * feature).sum()
               for i, feature in enumerate(maps))
    loss.backward()
    result = {f'map{i}': _projections(feature.detach(), f'{name}/map{i}')
              for i, feature in enumerate(maps)}
    result['image_grad'] = _projections(images.grad, f'{name}/image_grad')
    result['param_grad'] = sum(
        _cosine_projections(param.grad, key) for key, param in
        sorted(model.named_parameters()) if param.grad is not None).tolist()
    return result


def main(path: str, commit: str, *names: str) -> None:
    """Adds this torch release's projections of every case (or of those
    ``names``) to the record at ``path`` (made by ``commit``)."""
    torch.set_num_threads(1)
    try:
        with open(path) as stream:
            record = json.load(stream)
    except FileNotFoundError:
        record = dict(commit=commit, releases={})
    if record['commit'] != commit:
        raise SystemExit(f'{path} records commit {record["commit"]}, not {commit}.')
    version = torch.__version__.split('+')[0]
    cases = [case for case in CASES if not names or case[0] in names]
    if len(cases) != len(names or CASES):
        raise SystemExit(f'unknown cases in {names}; expected some of '
                         f'{[case[0] for case in CASES]}.')
    release = record['releases'].setdefault(version, {})
    release.update({case[0]: case_projections(case) for case in cases})
    with open(path, 'w') as stream:
        json.dump(record, stream, indent=1)


if __name__ == '__main__':
    main(*sys.argv[1:])
