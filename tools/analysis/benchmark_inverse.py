"""Time the bottleneck inverse of SOFT: Newton iterations against the exact solver.

For each bottleneck size m, builds Gaussian-kernel matrices of random
bottleneck tokens (one per head, as in a SOFT attention call), times
``kernel_inverse`` with each solver (median of repeats) and reports the
speed-up and the largest relative difference of the two results.

Example::

    python tools/analysis/benchmark_inverse.py --sizes 49 240 1050 --heads 10
"""
import argparse
import json
import statistics
import time

import torch

from mmsoft.models.layers import gaussian_kernel, kernel_inverse


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[49, 240, 1050])
    parser.add_argument('--heads', type=int, default=10)
    parser.add_argument('--head-dims', type=int, default=32)
    parser.add_argument('--spread', type=float, default=1.0,
                        help='standard deviation of the random tokens')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--newton-iters', type=int, default=20)
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


def main():
    args = parse_args()
    torch.manual_seed(0)
    rows = []
    for size in args.sizes:
        tokens = args.spread * torch.randn(1, args.heads, size, args.head_dims)
        mats = gaussian_kernel(tokens, tokens)  # (1, heads, m, m)
        for variant in ('soft', 'soft++'):
            newton_s, newton = timed(
                lambda: kernel_inverse(mats, variant, 'newton', args.newton_iters),
                args.repeats)
            exact_s, exact = timed(lambda: kernel_inverse(mats, variant, 'cholesky'),
                                   args.repeats)
            rel = float((newton - exact).norm() / exact.norm())
            row = dict(m=size, heads=args.heads, variant=variant,
                       newton_seconds=newton_s, exact_seconds=exact_s,
                       speedup=newton_s / exact_s, relative_difference=rel)
            rows.append(row)
            print(f'm={size:5d} {variant:6s} newton {newton_s * 1e3:9.2f} ms  '
                  f'exact {exact_s * 1e3:9.2f} ms  speed-up {row["speedup"]:6.1f}x  '
                  f'rel. difference {rel:.1e}', flush=True)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(dict(threads=torch.get_num_threads(), results=rows), file,
                      indent=2)


if __name__ == '__main__':
    main()
