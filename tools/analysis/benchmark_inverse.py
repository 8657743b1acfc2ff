"""Time the bottleneck inverse of SOFT under each solver.

For each bottleneck size m, builds Gaussian-kernel matrices of random
bottleneck tokens (one per head, as in a SOFT attention call), times
the ``kernel_inverse`` that training runs by default (the memory-efficient
one, whose Newton iteration is
:func:`mmsoft.models.memory_efficient.recomputed_newton_iterations`) with each
solver (median of repeats, forward and, with
``--backward``, forward plus backward) and reports each solver's time
relative to the exact solver and its largest relative difference from the
Newton iteration (the function the published checkpoints were trained with).

Example::

    python tools/analysis/benchmark_inverse.py --sizes 49 240 1050 --heads 10
"""
import argparse
import json
import statistics
import time

import torch

from mmsoft.models.soft import gaussian_kernel
from mmsoft.models.soft import kernel_inverse
from mmsoft.models.memory_efficient import recomputed_newton_iterations
from mmsoft.models.soft import SOLVERS


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[49, 240, 1050])
    parser.add_argument('--heads', type=int, default=10)
    parser.add_argument('--head-dims', type=int, default=32)
    parser.add_argument('--spread', type=float, default=1.0,
                        help='standard deviation of the random tokens')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--newton-iters', type=int, default=20)
    parser.add_argument('--backward', action='store_true',
                        help='time forward plus backward')
    parser.add_argument('--json', help='write the results to this file')
    return parser.parse_args()


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def solver_step(mats, attention, solver, newton_iters, backward):
    """One inverse (and its backward) of ``mats``; returns the inverse."""
    mats = mats.detach().requires_grad_(backward)
    inverse = kernel_inverse(mats, attention, solver, newton_iters,
                             recomputed_newton_iterations)
    if backward:
        inverse.sum().backward()
    return inverse.detach()


def relative_difference(actual, expected):
    return float((actual - expected).norm() / expected.norm())


def main():
    args = parse_args()
    torch.manual_seed(0)
    rows = []
    for size in args.sizes:
        tokens = args.spread * torch.randn(1, args.heads, size, args.head_dims)
        mats = gaussian_kernel(tokens, tokens)  # (1, heads, m, m)
        for attention in ('soft', 'soft++'):
            results = {
                solver: timed(lambda: solver_step(mats, attention, solver,
                                                  args.newton_iters, args.backward),
                              args.repeats)
                for solver in SOLVERS
            }
            exact_seconds = results['exact'][0]
            newton = results['newton'][1]
            for solver, (seconds, inverse) in results.items():
                row = dict(m=size, heads=args.heads, attention=attention,
                           solver=solver, backward=args.backward, seconds=seconds,
                           relative_to_exact=seconds / exact_seconds,
                           difference_from_newton=relative_difference(inverse, newton))
                rows.append(row)
                print(f'm={size:5d} {attention:6s} {solver:18s} '
                      f'{seconds * 1e3:9.2f} ms '
                      f'({row["relative_to_exact"]:5.2f}x exact)  rel. difference '
                      f'from newton {row["difference_from_newton"]:.1e}', flush=True)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(dict(threads=torch.get_num_threads(), results=rows), file,
                      indent=2)


if __name__ == '__main__':
    main()
