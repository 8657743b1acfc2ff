"""UFO-ViT's layers: XNorm attention, local patch interaction, Fourier positions."""
from .fourier_position import FourierPositionEncoding
from .local_patch_interaction import LocalPatchInteraction
from .ufo_attention import UFOAttention, ufo_attention, xnorm
from .ufo_block import UFOBlock

__all__ = [
    'FourierPositionEncoding', 'LocalPatchInteraction', 'UFOAttention',
    'ufo_attention', 'xnorm', 'UFOBlock'
]
