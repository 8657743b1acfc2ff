"""UFO-ViT read out at its own stride (16), for classification heads."""
from mmpretrain.registry import MODELS

from ..openmmlab import UFOViT


@MODELS.register_module()
class UFOViTStride16(UFOViT):
    """:class:`~mmsoft.openmmlab.UFOViT` whose only output is the last
    block's token map at stride 16.

    ``UFOViT(out_indices=(3, ))`` reads the tokens after the last block and
    max-pools them 2x2 to stride 32. This backbone returns them unpooled, one
    map (B, C, ceil(H/16), ceil(W/16)) for an H x W image, so that a
    classification head (:class:`~mmsoft.pretrain.UFOViTClassAttentionHead`)
    reads every token of the last block, as XCiT's class attention does. It
    runs all blocks and has exactly the parameters and state-dict keys of
    ``UFOViT(out_indices=(3, ))``, so its checkpoints load into ``UFOViT``
    (``tools/model_converters/ufo_vit_cls2backbone.py``). Valid regions of
    padded batches are honoured as in ``UFOViT`` (the map is zero outside
    them).

    Args:
        **kwargs: The arguments of ``UFOViT`` (``arch``, ``drop_path_rate``,
            ``frozen_stages``, ``init_cfg``, ...) except ``out_indices``.

    Raises:
        ValueError: ``out_indices`` is given.
    """

    def __init__(self, **kwargs):
        if 'out_indices' in kwargs:
            raise ValueError(f'out_indices={kwargs["out_indices"]!r} is not an '
                             f'argument of UFOViTStride16: its only output is the '
                             f'last block at stride 16; use UFOViT for other '
                             f'outputs.')
        super().__init__(out_indices=(3, ), multi_scale=False, **kwargs)
