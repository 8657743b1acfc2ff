"""UFO-ViT read out at its own stride (16), for classification heads."""
from mmpretrain.registry import MODELS

from ..openmmlab import UFOViT


@MODELS.register_module()
class UFOViTStride16(UFOViT):
    """``UFOViT(out_indices=(3, ))`` without its final 2x2 max-pool: one map
    (B, C, H / 16, W / 16) of the last block's tokens, every one of which a
    class-attention head reads. Its state-dict keys are ``UFOViT``'s; it
    takes ``UFOViT``'s arguments but ``out_indices`` (a ``ValueError``)."""

    def __init__(self, **kwargs):
        if 'out_indices' in kwargs:
            raise ValueError(f'out_indices={kwargs["out_indices"]!r} is not an '
                             f'argument of UFOViTStride16: its only output is the '
                             f'last block at stride 16; use UFOViT for other '
                             f'outputs.')
        super().__init__(out_indices=(3, ), multi_scale=False, **kwargs)
