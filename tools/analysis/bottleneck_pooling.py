"""What the bottleneck cap does to a SOFT backbone: grids, features and time.

For each input size, builds the backbone with and without the cap
(``max_bottleneck_tokens``), loads the same weights into both, and reports
each attention stage's bottleneck grid (before and after pooling), the
relative difference of each stage's output (``||capped - uncapped|| /
||uncapped||``) and the time of each forward.

Example::

    python tools/analysis/bottleneck_pooling.py --arch tiny \
        --sizes 512x512 512x683 800x1333 --cap 256
"""
import argparse
import json
import time

import torch

from mmsoft_analysis.sizes import parse_size
from mmsoft.openmmlab import SOFT
from mmsoft.models.soft import capped_grid_size


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', default='tiny')
    parser.add_argument('--attention', default='soft++')
    parser.add_argument('--solver', default='newton_closed_form')
    parser.add_argument('--cap', type=int, default=256,
                        help='max_bottleneck_tokens of the capped model')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[parse_size(s) for s in ('512x512', '512x683',
                                                         '800x1333')])
    parser.add_argument('--checkpoint',
                        help='mmsoft-layout backbone weights, loaded strictly '
                        "(default: the backbone's own initialisation, seed 0)")
    parser.add_argument('--json', help='write the results to this file')
    return parser.parse_args()


def bottleneck_grids(model: SOFT, size, cap):
    """(grid, pooled grid) of each SOFT attention stage for an input size."""
    grids = []
    for stage, ratio in enumerate(model.arch_settings['sr_ratios'][:3]):
        tokens = [-(-side // 2**(stage + 2)) for side in size]
        grid = tuple(side // ratio for side in tokens)
        grids.append((grid, capped_grid_size(*grid, cap)))
    return grids


def timed_forward(model, image):
    start = time.perf_counter()
    with torch.no_grad():
        outs = model(image)
    return time.perf_counter() - start, outs


def main():
    args = parse_args()
    torch.manual_seed(0)
    kwargs = dict(arch=args.arch, variant=args.attention, solver=args.solver,
                  drop_path_rate=0.)
    capped = SOFT(max_bottleneck_tokens=args.cap, **kwargs)
    if args.checkpoint:
        capped.load_pretrained(dict(checkpoint=args.checkpoint))
    else:
        capped.init_weights()
    uncapped = SOFT(max_bottleneck_tokens=None, **kwargs)
    uncapped.load_state_dict(capped.state_dict())
    rows = []
    for size in args.sizes:
        image = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
        capped_s, capped_outs = timed_forward(capped.eval(), image)
        uncapped_s, uncapped_outs = timed_forward(uncapped.eval(), image)
        differences = [float((c - u).norm() / u.norm())
                       for c, u in zip(capped_outs, uncapped_outs)]
        grids = bottleneck_grids(capped, size, args.cap)
        row = dict(size=size, grids=grids, relative_difference=differences,
                   capped_seconds=capped_s, uncapped_seconds=uncapped_s)
        rows.append(row)
        grid_text = ', '.join(f'{a[0]}x{a[1]}->{b[0]}x{b[1]}' for a, b in grids)
        print(f'{size[0]}x{size[1]}: bottleneck grids {grid_text}; stage '
              f'differences {", ".join(f"{d:.3f}" for d in differences)}; '
              f'{capped_s:.2f} s capped, {uncapped_s:.2f} s uncapped', flush=True)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(dict(arch=args.arch, attention=args.attention,
                           solver=args.solver, cap=args.cap, results=rows), file,
                      indent=2)


if __name__ == '__main__':
    main()
