"""Draw the four output maps of a backbone on generated demo images.

Each map of a freshly initialised SOFT++-tiny (or UFO-ViT-tiny) is drawn as
its first three principal components, one row per scene; the README's picture
is this tool's output with the defaults.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

# The checkout, for ``import mmsoft`` without an installed package.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402

#: The backbones that can be drawn: name -> (class name, arguments).
BACKBONES = {
    'SOFT++-tiny': ('SOFT', dict(arch='tiny', solver='newton_closed_form')),
    'UFO-ViT-tiny': ('UFOViT', dict(arch='tiny')),
}
#: The configs' image normalisation (ImageNet mean and std, RGB).
MEAN = np.array([123.675, 116.28, 103.53], np.float32)
STD = np.array([58.395, 57.12, 57.375], np.float32)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Draw the multi-scale outputs of the backbones on a '
        'generated demo image.')
    parser.add_argument('--out', default='docs/images/backbone_outputs.png',
                        help='the PNG written (default: %(default)s)')
    parser.add_argument('--backbone', default='SOFT++-tiny',
                        choices=sorted(BACKBONES),
                        help='the backbone drawn (default: %(default)s)')
    parser.add_argument('--size', default='224x320',
                        help='image size HxW (default: %(default)s)')
    parser.add_argument('--seeds', type=int, nargs='+', default=[3, 11],
                        help='one scene per seed; the first also seeds the '
                        'weights (default: %(default)s)')
    return parser.parse_args(argv)


def demo_image(height: int, width: int, seed: int) -> np.ndarray:
    """One generated scene, uint8 RGB (H, W, 3)."""
    from demo_data import DEFAULT_CLASSES, SHAPES, render_scene
    scene = render_scene(np.random.default_rng(seed), height, width,
                         len(DEFAULT_CLASSES),
                         [SHAPES[name] for name in DEFAULT_CLASSES])
    return scene.image[..., ::-1].copy()  # BGR -> RGB


def principal_components(feature: torch.Tensor) -> np.ndarray:
    """A (C, h, w) map as its first three principal components over the
    channels, each scaled to [0, 1]: float (h, w, 3)."""
    channels, height, width = feature.shape
    x = feature.reshape(channels, -1).T.double()
    x = x - x.mean(0)
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    y = (x @ v[:3].T).numpy()
    lo, hi = np.percentile(y, 1, axis=0), np.percentile(y, 99, axis=0)
    y = np.clip((y - lo) / np.maximum(hi - lo, 1e-12), 0, 1)
    return y.reshape(height, width, 3)


def backbone_outputs(name: str, images: List[np.ndarray],
                     seed: int) -> List[List[torch.Tensor]]:
    """The four (C, h, w) maps of backbone ``name`` for each image."""
    from mmsoft.openmmlab import backbones
    class_name, kwargs = BACKBONES[name]
    torch.manual_seed(seed)
    model = getattr(backbones, class_name)(**kwargs)
    model.init_weights()
    model.eval()
    maps = []
    with torch.no_grad():
        for image in images:
            x = torch.from_numpy((image.astype(np.float32) - MEAN) / STD)
            maps.append([out[0] for out in model(x.permute(2, 0, 1)[None])])
    return maps


def draw(name: str, images: List[np.ndarray],
         maps: List[List[torch.Tensor]], out: str) -> None:
    """Each image and its four maps, one row per image."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(images), 5,
                             figsize=(12.5, 0.3 + 2.0 * len(images)),
                             squeeze=False, subplot_kw=dict(xticks=[], yticks=[]))
    for r, (image, row) in enumerate(zip(images, maps)):
        axes[r, 0].imshow(image)
        axes[r, 0].set_title(f'input {image.shape[0]}×{image.shape[1]}',
                             fontsize=9)
        for c, feature in enumerate(row, start=1):
            axes[r, c].imshow(principal_components(feature),
                              interpolation='nearest')
            _, height, width = feature.shape
            axes[r, c].set_title(
                f'stride {image.shape[0] // height}: '
                f'{feature.shape[0]}×{height}×{width}', fontsize=9)
    fig.suptitle(f'{name}, freshly initialised: its four outputs (channels '
                 '× height × width; first three principal components as RGB)',
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=72)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> str:
    """Draws the figure; prints and returns its path."""
    args = parse_args(argv)
    height, width = (int(v) for v in args.size.lower().split('x'))
    images = [demo_image(height, width, seed) for seed in args.seeds]
    maps = backbone_outputs(args.backbone, images, args.seeds[0])
    draw(args.backbone, images, maps, args.out)
    print(f'wrote {args.out}', flush=True)
    return args.out


if __name__ == '__main__':
    main()
