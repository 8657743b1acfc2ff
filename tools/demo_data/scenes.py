"""Random scenes of overlapping shapes on textured backgrounds, the renderer
of every demo dataset. An object's class is told by its outline only: colour,
shading and noise are random. A later object may cover an earlier one, which
keeps at least ``min_visible`` of its area."""
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

#: Sub-pixel precision used by ``cv2.fillPoly`` (coordinates scaled by 2**4).
_SHIFT = 4


def _regular_polygon(num: int, radius: float, phase: float) -> np.ndarray:
    angles = phase + 2 * np.pi * np.arange(num) / num
    return np.stack([np.cos(angles), np.sin(angles)], 1) * radius


def _circle(radius: float, rng: np.random.Generator) -> np.ndarray:
    return _regular_polygon(64, radius, 0.0)


def _triangle(radius: float, rng: np.random.Generator) -> np.ndarray:
    return _regular_polygon(3, radius, rng.uniform(0, 2 * np.pi))


def _square(radius: float, rng: np.random.Generator) -> np.ndarray:
    return _regular_polygon(4, radius, rng.uniform(0, np.pi / 2))


def _star(radius: float, rng: np.random.Generator) -> np.ndarray:
    outer = _regular_polygon(5, radius, rng.uniform(0, 2 * np.pi))
    phase = math.atan2(outer[0, 1], outer[0, 0]) + np.pi / 5
    inner = _regular_polygon(5, radius * 0.45, phase)
    return np.stack([outer, inner], 1).reshape(-1, 2)


def _cross(radius: float, rng: np.random.Generator) -> np.ndarray:
    arm = radius * 0.38
    pts = np.array([[-arm, -radius], [arm, -radius], [arm, -arm], [radius, -arm],
                    [radius, arm], [arm, arm], [arm, radius], [-arm, radius],
                    [-arm, arm], [-radius, arm], [-radius, -arm], [-arm, -arm]])
    theta = rng.uniform(0, np.pi / 2)
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    return pts @ rot.T


#: Outline generators: ``f(radius, rng) -> (N, 2)`` vertices around the origin.
SHAPES: Dict[str, Callable[[float, np.random.Generator], np.ndarray]] = {
    'circle': _circle,
    'triangle': _triangle,
    'square': _square,
    'star': _star,
    'cross': _cross,
}

#: Classes of the generated datasets unless told otherwise.
DEFAULT_CLASSES: Tuple[str, ...] = ('circle', 'triangle', 'square', 'star')


@dataclass(eq=False)
class SceneObject:
    """One painted object: its ``label``, and its ``full_mask`` and
    ``visible_mask``, bool (H, W)."""
    label: int
    full_mask: np.ndarray
    visible_mask: Optional[np.ndarray] = None


@dataclass(eq=False)
class Scene:
    """A rendered BGR ``image``, uint8 (H, W, 3), and its ``objects`` in
    painting order."""
    image: np.ndarray
    objects: List[SceneObject]

    def label_map(self, background: int = 0, offset: int = 1) -> np.ndarray:
        """The uint8 (H, W) class map: ``background`` or ``label + offset``."""
        out = np.full(self.image.shape[:2], background, np.uint8)
        for obj in self.objects:
            out[obj.visible_mask] = obj.label + offset
        return out


def split_seeds(seed: int) -> Tuple[int, int]:
    """Seeds of the train and val splits from two streams of ``seed``: the
    splits share no image, and a seed always gives the same files."""
    train, val = np.random.SeedSequence(seed).spawn(2)
    return int(train.generate_state(1)[0]), int(val.generate_state(1)[0])


def check_classes(classes: Sequence[str]) -> Tuple[str, ...]:
    """``classes`` as a tuple; a ``ValueError`` unless 3 or more distinct
    known shapes."""
    classes = tuple(classes)
    unknown = [c for c in classes if c not in SHAPES]
    if unknown:
        raise ValueError(f'unknown shape classes {unknown}; available: {list(SHAPES)}')
    if len(set(classes)) != len(classes) or len(classes) < 3:
        raise ValueError(f'classes={classes} must be at least 3 distinct shapes')
    return classes


def _smooth_noise(rng: np.random.Generator, height: int, width: int,
                  cells: int) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a random grid upsampled bicubically."""
    grid = rng.random((cells + 1, cells + 1, 3)).astype(np.float32)
    return np.clip(cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC),
                   0, 1)


def render_background(rng: np.random.Generator, height: int,
                      width: int) -> np.ndarray:
    """A uint8 (H, W, 3) background: a random colour, tint gradient and noise."""
    base = rng.uniform(40, 215, 3)
    tint = rng.uniform(-60, 60, 3)
    # float64 explicitly: ``np.cos(angle)`` is a float64 scalar, which NumPy 2
    # (NEP 50) promotes a float32 grid to float64 with, while NumPy 1 kept the
    # product float32. Both versions must write identical files.
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * xs / width + np.sin(angle) * ys / height)[..., None]
    img = base + tint * ramp
    img = img + (_smooth_noise(rng, height, width, int(rng.integers(3, 8))) - 0.5) * \
        rng.uniform(30, 90)
    # Thin straight strokes as clutter: edges that belong to no object.
    clutter = np.zeros((height, width, 3), np.float32)
    for _ in range(int(rng.integers(2, 7))):
        p1 = tuple(int(v) for v in rng.integers(0, [width, height]))
        p2 = tuple(int(v) for v in rng.integers(0, [width, height]))
        colour = tuple(float(v) for v in rng.uniform(-50, 50, 3))
        cv2.line(clutter, p1, p2, colour, int(rng.integers(1, 3)), cv2.LINE_AA)
    img = img + clutter
    img = img + rng.normal(0, rng.uniform(4, 12), img.shape)
    return np.clip(img, 0, 255).astype(np.float32)


def _object_texture(rng: np.random.Generator, height: int, width: int,
                    background_mean: np.ndarray) -> np.ndarray:
    """Colour field of one object's box: a contrasting colour, shading, noise."""
    for _ in range(20):
        colour = rng.uniform(0, 255, 3)
        if np.abs(colour - background_mean).sum() > 120:
            break
    shade = (_smooth_noise(rng, height, width, 2)[..., :1] - 0.5) * rng.uniform(20, 60)
    return colour + shade + rng.normal(0, rng.uniform(3, 10), (height, width, 3))


def _polygon_mask(points: np.ndarray, height: int, width: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    pts = np.round(points * (1 << _SHIFT)).astype(np.int32)
    cv2.fillPoly(mask, [pts], 1, lineType=cv2.LINE_8, shift=_SHIFT)
    return mask.astype(bool)


def render_scene(rng: np.random.Generator,
                 height: int,
                 width: int,
                 num_classes: int,
                 shape_fns: Sequence[Callable],
                 num_objects: Tuple[int, int] = (2, 6),
                 size_range: Tuple[float, float] = (0.1, 0.6),
                 min_visible: float = 0.6,
                 min_pixels: int = 40,
                 max_tries: int = 60) -> Scene:
    """Renders one scene of ``num_objects`` (an inclusive range) objects,
    each of a uniformly drawn class, its diameter a log-uniform fraction
    ``size_range`` of the shorter side, placed in at most ``max_tries``
    attempts so that every object keeps ``min_visible`` of its area and
    ``min_pixels`` pixels."""
    side = min(height, width)
    lo, hi = np.log(size_range[0] * side), np.log(size_range[1] * side)
    while True:
        target = int(rng.integers(num_objects[0], num_objects[1] + 1))
        objects: List[SceneObject] = []
        for _ in range(target):
            placed = None
            for _ in range(max_tries):
                label = int(rng.integers(num_classes))
                radius = float(np.exp(rng.uniform(lo, hi))) / 2
                # Centres may lie near the border, but most of the shape stays in.
                margin = radius * 0.5
                cx = rng.uniform(margin, width - margin)
                cy = rng.uniform(margin, height - margin)
                outline = shape_fns[label](radius, rng) + [cx, cy]
                mask = _polygon_mask(outline, height, width)
                if mask.sum() < max(min_pixels, 0.75 * _full_area(outline)):
                    continue  # too small or cut off too much by the border
                if _keeps_visible(objects, mask, min_visible, min_pixels):
                    placed = SceneObject(label, mask)
                    break
            if placed is None:
                continue
            objects.append(placed)
        if len(objects) >= num_objects[0]:
            break
    _set_visible_masks(objects)
    background = render_background(rng, height, width)
    image = background.copy()
    for obj in objects:
        ys, xs = np.nonzero(obj.full_mask)
        box = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
        mask = obj.full_mask[box]
        texture = _object_texture(rng, mask.shape[0], mask.shape[1],
                                  background[obj.full_mask].mean(0))
        image[box][mask] = texture[mask]
    image = cv2.GaussianBlur(np.clip(image, 0, 255).astype(np.float32), (3, 3), 0.6)
    return Scene(np.clip(np.round(image), 0, 255).astype(np.uint8), objects)


def _full_area(outline: np.ndarray) -> float:
    """Shoelace area of a polygon."""
    x, y = outline[:, 0], outline[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def _keeps_visible(objects: List[SceneObject], new_mask: np.ndarray,
                   min_visible: float, min_pixels: int) -> bool:
    """Whether all earlier objects stay visible enough under ``new_mask``."""
    above = new_mask.copy()
    for obj in reversed(objects):
        # Visibility after every object painted so far, plus the new one.
        remaining = obj.full_mask & ~above
        above |= obj.full_mask
        full = obj.full_mask.sum()
        if remaining.sum() < max(min_pixels, min_visible * full):
            return False
        if not is_simple_region(remaining):
            return False
    return is_simple_region(new_mask)


def is_simple_region(mask: np.ndarray) -> bool:
    """Whether ``mask`` is one connected region without holes."""
    num, _ = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    if num != 2:
        return False
    # A hole is a part of the complement not connected to the image border.
    outside = np.pad(~mask, 1, constant_values=True).astype(np.uint8)
    num, _ = cv2.connectedComponents(outside, connectivity=4)
    return num == 2


def _set_visible_masks(objects: List[SceneObject]) -> None:
    above = np.zeros_like(objects[0].full_mask)
    for obj in reversed(objects):
        obj.visible_mask = obj.full_mask & ~above
        above |= obj.full_mask
