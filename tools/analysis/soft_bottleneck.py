"""SOFT's bottleneck: the inverse under each solver, and what the cap on its
tokens changes.

``inverse``: each solver's time and difference from the Newton iteration at
each bottleneck size; ``pooling``: a SOFT backbone with and without
``max_bottleneck_tokens`` at each size (docs/benchmarks.md).
"""
import argparse
import json

import torch

from mmsoft.models import SOFT
from mmsoft.models.soft import (SOLVERS, capped_grid_size, gaussian_kernel,
                                kernel_inverse)
from mmsoft_analysis import parse_size, timed


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--json', help='write the results to this file')
    commands = parser.add_subparsers(dest='command', required=True)
    inverse = commands.add_parser('inverse', parents=[common], help='time each solver')
    inverse.add_argument('--sizes', type=int, nargs='+', default=[49, 240, 1050])
    inverse.add_argument('--heads', type=int, default=10)
    inverse.add_argument('--spread', type=float, default=1.0,
                         help='standard deviation of the random tokens')
    inverse.add_argument('--repeats', type=int, default=3)
    inverse.add_argument('--backward', action='store_true',
                         help='time forward plus backward')
    pooling = commands.add_parser('pooling', parents=[common],
                                  help='capped against uncapped')
    pooling.add_argument('--arch', default='tiny')
    pooling.add_argument('--cap', type=int, default=256,
                         help='max_bottleneck_tokens of the capped model')
    pooling.add_argument('--sizes', nargs='+', type=parse_size,
                         default=[(512, 512), (512, 683), (800, 1333)])
    return parser.parse_args()


def inverse_rows(args):
    torch.manual_seed(0)
    for size in args.sizes:
        tokens = args.spread * torch.randn(1, args.heads, size, 32)  # head dims
        mats = gaussian_kernel(tokens, tokens)  # (1, heads, m, m)
        for attention in ('soft', 'soft++'):
            def step(solver):
                leaf = mats.detach().requires_grad_(args.backward)
                inverse = kernel_inverse(leaf, attention, solver, 20)  # Newton steps
                if args.backward:
                    inverse.sum().backward()
                return inverse.detach()
            results = {solver: timed(lambda: step(solver), args.repeats)
                       for solver in SOLVERS}
            newton = results['newton'][1]
            for solver, (seconds, inverse) in results.items():
                row = dict(m=size, heads=args.heads, attention=attention, solver=solver,
                           backward=args.backward, seconds=seconds,
                           relative_to_exact=seconds / results['exact'][0],
                           difference_from_newton=float((inverse - newton).norm()
                                                        / newton.norm()))
                print(f"m={size:5d} {attention:6s} {solver:18s} "
                      f"{seconds * 1e3:9.2f} ms "
                      f"({row['relative_to_exact']:5.2f}x exact)  rel. difference from "
                      f"newton {row['difference_from_newton']:.1e}", flush=True)
                yield row


def pooling_rows(args):
    torch.manual_seed(0)
    settings = dict(arch=args.arch, variant='soft++', solver='newton_closed_form',
                    drop_path_rate=0.)
    capped = SOFT(max_bottleneck_tokens=args.cap, **settings).eval()
    uncapped = SOFT(max_bottleneck_tokens=None, **settings).eval()
    uncapped.load_state_dict(capped.state_dict())
    for size in args.sizes:
        image = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            (capped_s, capped_outs), (uncapped_s, uncapped_outs) = (timed(
                lambda: model.forward_intermediates(image, intermediates_only=True),
                1, 0) for model in (capped, uncapped))
        differences = [float((c - u).norm() / u.norm())
                       for c, u in zip(capped_outs, uncapped_outs)]
        grids = [tuple(-(-side // 2**(stage + 2)) // ratio for side in size)
                 for stage, ratio in enumerate(capped.arch_settings['sr_ratios'][:3])]
        grids = [(grid, capped_grid_size(*grid, args.cap)) for grid in grids]
        print(f"{size[0]}x{size[1]}: bottleneck grids "
              + ', '.join(f'{a[0]}x{a[1]}->{b[0]}x{b[1]}' for a, b in grids)
              + '; stage differences ' + ', '.join(f'{d:.3f}' for d in differences),
              flush=True)
        yield dict(size=size, grids=grids, relative_difference=differences,
                   capped_seconds=capped_s, uncapped_seconds=uncapped_s)


def main():
    args = parse_args()
    rows = list((inverse_rows if args.command == 'inverse' else pooling_rows)(args))
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(dict(vars(args), results=rows), file, indent=2, default=str)


if __name__ == '__main__':
    main()
