"""UFO-ViT's position encoding: sinusoids of the actual grid's coordinates."""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ...ops.valid_region import ValidShapes, pad_to_grid, per_distinct_shape


class FourierPositionEncoding(nn.Module):
    """Sinusoidal encoding of normalised (y, x) coordinates, projected by 1x1 conv.

    Computed for the actual grid at every forward, so nothing is tied to a
    training resolution. Coordinates are the cell indices ``1..H`` and
    ``1..W`` normalised to (0, 2*pi]; each is encoded by ``hidden_dims``
    sines/cosines of geometrically spaced frequencies, y features first.
    With ``valid_shapes`` each image of a padded batch gets the encoding of
    its own grid. XCiT's ``PositionalEncodingFourier`` with the same weights
    (``proj`` is its ``token_projection``) gives the same encoding of a grid
    (``docs/ufo_vit_design.md``).

    Args:
        embed_dims (int): Output channels.
        hidden_dims (int): Features per coordinate. Default: 32.
        temperature (float): Frequency base. Default: 10000.
    """

    def __init__(self, embed_dims: int, hidden_dims: int = 32,
                 temperature: float = 10000.):
        super().__init__()
        self.hidden_dims = hidden_dims
        self.temperature = temperature
        self.proj = nn.Conv2d(2 * hidden_dims, embed_dims, kernel_size=1)

    def encode_axis(self, length: int, device) -> torch.Tensor:
        """Sinusoidal features of one axis: (length, hidden_dims)."""
        coords = torch.arange(1, length + 1, dtype=torch.float32, device=device)
        coords = coords / (length + 1e-6) * 2 * math.pi  # (length, )
        index = torch.arange(self.hidden_dims, dtype=torch.float32, device=device)
        freqs = self.temperature**(2 * torch.div(index, 2, rounding_mode='floor') /
                                   self.hidden_dims)
        angles = coords[:, None] / freqs  # (length, hidden)
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()),
                           dim=2).flatten(1)

    def forward(self, batch: int, hw_shape: Tuple[int, int], device=None,
                valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Encoding of a (H, W) grid: (batch, embed_dims, H, W).

        With ``valid_shapes`` (each image's valid (h, w) of the grid), each
        image gets the encoding of its own grid, zero outside it.
        """
        if valid_shapes is None:
            return self.encode_grid(hw_shape, device).expand(batch, -1, -1, -1)
        encodings = per_distinct_shape(  # (1, C, h, w) each
            lambda shape: self.encode_grid(shape, device), valid_shapes)
        return torch.cat([pad_to_grid(encodings[shape], hw_shape)
                          for shape in valid_shapes])

    def encode_grid(self, hw_shape: Tuple[int, int], device=None) -> torch.Tensor:
        """Encoding of one (H, W) grid: (1, embed_dims, H, W)."""
        height, width = hw_shape
        device = device or self.proj.weight.device
        pos_y = self.encode_axis(height, device)[:, None, :].expand(-1, width, -1)
        pos_x = self.encode_axis(width, device)[None, :, :].expand(height, -1, -1)
        pos = torch.cat((pos_y, pos_x), dim=-1).permute(2, 0, 1)  # (2*hidden, H, W)
        pos = pos.to(self.proj.weight.dtype).unsqueeze(0)
        return self.proj(pos)
