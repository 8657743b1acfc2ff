"""Check that mmcv's compiled ops import and run: NMS and RoIAlign on the CPU
and, where a GPU is visible, on CUDA, against each other and against the
expected result.

    python tools/analysis/check_mmcv_ops.py [--cuda-version 13.0] [--require-cuda]

``--cuda-version`` also checks the CUDA release the ops were compiled with
(``mmcv.ops.get_compiling_cuda_version()``; ``'not available'`` for a build
without CUDA ops). ``--require-cuda`` fails where no GPU is visible instead
of running the CPU kernels alone. Prints what it ran; exit status 0, or 1
naming the first check that failed.
"""
import argparse
import sys
from typing import List, Optional


def check(cuda_version: Optional[str], require_cuda: bool) -> List[str]:
    """Runs the checks; returns the lines to print.

    Raises:
        RuntimeError: naming the check that failed.
    """
    import mmcv
    import torch
    from mmcv.ops import get_compiling_cuda_version, nms, roi_align

    compiled = get_compiling_cuda_version()
    lines = [f'mmcv {mmcv.__version__} ({mmcv.__file__}), ops compiled with CUDA '
             f'{compiled}; torch {torch.__version__}']
    if cuda_version is not None and compiled != cuda_version:
        raise RuntimeError(f'mmcv._ext was compiled with CUDA {compiled!r}, expected '
                           f'{cuda_version!r} (--cuda-version)')
    devices = ['cpu']
    if torch.cuda.is_available():
        devices.append('cuda')
    elif require_cuda:
        raise RuntimeError('no GPU visible (torch.cuda.is_available() is False) and '
                           '--require-cuda was given')
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.],
                          [0., 0., 10., 9.]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    # A ramp, so that every bin of RoIAlign has its own value.
    features = torch.arange(2 * 8 * 8, dtype=torch.float32).reshape(1, 2, 8, 8)
    rois = torch.tensor([[0., 0., 0., 4., 4.], [0., 2., 2., 7., 6.]])
    pooled = {}
    for device in devices:
        _, keep = nms(boxes.to(device), scores.to(device), iou_threshold=0.5)
        if keep.cpu().tolist() != [3, 2]:
            raise RuntimeError(f'nms on {device} kept boxes {keep.cpu().tolist()}, '
                               'expected [3, 2]')
        # An autograd Function's apply: output size, spatial scale, sampling
        # ratio, pooling mode, aligned; positional only.
        pooled[device] = roi_align(features.to(device), rois.to(device), (2, 2), 1.0, 2,
                                   'avg', True).cpu()
        total = pooled[device].sum().item()
        lines.append(f'{device}: nms kept [3, 2]; roi_align '
                     f'{tuple(pooled[device].shape)}, sum {total:.4f}')
    # The first RoI covers pixels 0-4 of a ramp: each bin's mean is its
    # centre's value (aligned: the box starts at pixel centre 0).
    centre = features[0, 0, [1, 3]][:, [1, 3]] - 0.5 * 8 - 0.5
    if not torch.allclose(pooled['cpu'][0, 0], centre, atol=1e-4):
        raise RuntimeError(f'roi_align on cpu pooled {pooled["cpu"][0, 0].tolist()}, '
                           f'expected {centre.tolist()}')
    if 'cuda' in pooled and not torch.allclose(pooled['cpu'], pooled['cuda'],
                                               atol=1e-4):
        raise RuntimeError('roi_align differs between cpu and cuda: '
                           f'{(pooled["cpu"] - pooled["cuda"]).abs().max().item()}')
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Check mmcv's compiled ops.")
    parser.add_argument('--cuda-version',
                        help='the CUDA release the ops must be compiled with, '
                        'e.g. 13.0')
    parser.add_argument('--require-cuda', action='store_true',
                        help='fail where no GPU is visible')
    args = parser.parse_args(argv)
    try:
        lines = check(args.cuda_version, args.require_cuda)
    except (ImportError, RuntimeError) as error:
        print(f'check_mmcv_ops: {type(error).__name__}: {error}', file=sys.stderr)
        return 1
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
