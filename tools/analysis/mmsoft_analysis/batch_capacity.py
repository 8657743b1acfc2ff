"""The largest batch that fits a memory budget, extrapolated linearly."""
import math
from typing import Dict


def largest_batch(peaks: Dict[int, int], limit_bytes: int) -> Dict:
    """Largest batch whose training peak stays within ``limit_bytes``.

    The peak of a training step is fixed memory plus a per-image part, so
    the line through the peaks measured at two batch sizes extrapolates it:
    ``peak(b) = fixed + b * per_image``.

    Args:
        peaks (dict[int, int]): Measured peak bytes by batch size, two or
            more entries (the smallest and largest batch are used).
        limit_bytes (int): The budget.

    Returns:
        dict: ``largest_batch`` (0 when not even one image fits),
        ``per_image_bytes``, ``fixed_bytes`` and ``measured_batches``.

    Raises:
        ValueError: With fewer than two batch sizes, or peaks that do not
            grow with the batch.
    """
    if len(peaks) < 2:
        raise ValueError(f'peaks={peaks} must hold two or more batch sizes.')
    low, high = min(peaks), max(peaks)
    per_image = (peaks[high] - peaks[low]) / (high - low)
    if per_image <= 0:
        raise ValueError(f'peaks={peaks} do not grow with the batch; measure '
                         f'again (the machine may have been disturbed).')
    fixed = peaks[low] - low * per_image
    batch = max(0, math.floor((limit_bytes - fixed) / per_image))
    return dict(largest_batch=batch, per_image_bytes=int(per_image),
                fixed_bytes=int(fixed), measured_batches=[low, high])
