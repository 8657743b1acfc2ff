"""UFO-ViT: an isotropic softmax-free vision transformer for dense prediction."""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.registry import MODELS

from ...checkpoint import load_ufo_vit_checkpoint
from ...utils import (check_divisible, check_mlp_ratio, check_out_indices,
                      check_positive_float, check_positive_int, check_rate,
                      resolve_arch)
from ..layers import (ConvPatchEmbed, FeaturePyramidAdapter,
                      FourierPositionEncoding, UFOBlock, init_transformer_weights)
from ..layers.shared.gelu import GELU
from ..ops.valid_region import ValidShapes
from .base import MultiStageBackbone, tokens_to_map

# Sizes chosen so that Mask R-CNN + FPN (mmdet's mask-rcnn_r50_fpn_1x_coco
# with this backbone and neck in_channels=[embed_dims] * 4) totals close to
# the paper's detectors: small 39.83M (paper 39.7M), medium 56.96M (paper
# 56.4M). Backbones alone: tiny 6.08M, small 19.62M, medium 36.62M,
# base 68.06M (see tests/test_ufo_vit.py).
ARCH_SETTINGS = {
    'tiny': dict(embed_dims=192, depth=12, num_heads=4),
    'small': dict(embed_dims=304, depth=16, num_heads=8),
    'medium': dict(embed_dims=416, depth=16, num_heads=8),
    'base': dict(embed_dims=512, depth=20, num_heads=8),
}
ARCH_DEFAULTS = dict(mlp_ratio=4., local_kernel_size=3, pos_hidden_dims=32)
NUM_STAGES = 4
PATCH_SIZE = 16
STEM_STRIDES = (2, 2, 2, 2)


@MODELS.register_module()
class UFOViT(MultiStageBackbone):
    """UFO-ViT backbone (Song, arXiv 2109.14382) in the XCiT layout.

    An isotropic stack of ``depth`` pre-norm :class:`UFOBlock` s (UFO
    attention, local patch interaction, MLP, each with per-channel scales) at
    stride 16, read out after four evenly spaced blocks and resampled to
    strides 4, 8, 16 and 32 by :class:`FeaturePyramidAdapter`.

    Resolution-free: the patch embedding is four 3x3 stride-2 convolutions
    (padding 1, BN, GELU between; channels in -> C/8 -> C/4 -> C/2 -> C), each
    mapping a side L to ceil(L / 2), so an H x W image gives a
    ceil(H/16) x ceil(W/16) token grid with no explicit padding and no pixel
    dropped; the Fourier position encoding is computed for that grid at every
    forward. No weight depends on the input size; images from 32x32 up work.

    Padded batches: told each image's valid region (``forward``'s
    ``valid_shapes`` or a valid-region data preprocessor), an image's
    features do not depend on its batch's padding; without it (the plain
    mmdet/mmseg preprocessors) padding counts as image content.

    Outputs: for an H x W image and ``h = ceil(H/16)``, ``w = ceil(W/16)``,
    output 0 is (B, C, 4h, 4w) (stride 4), 1 is (B, C, 2h, 2w) (stride 8),
    2 is (B, C, h, w) (stride 16) and 3 is (B, C, ceil(H/32), ceil(W/32))
    (stride 32). Output ``k`` reads the tokens after block
    ``(k + 1) * depth // 4 - 1`` (blocks depth/4-1, depth/2-1, 3depth/4-1 and
    depth-1 for a depth divisible by 4). Blocks after the last requested
    output are not run.

    Stages (for ``frozen_stages``): stage 0 is the patch embedding and the
    position encoding; stage k (1-4) is the k-th quarter of the blocks,
    ``blocks[(k-1) * depth // 4 : k * depth // 4]``, together with the
    resampling branch of output k-1.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'base'``
            or a dict with ``embed_dims`` (a multiple of 8 and of
            ``num_heads``), ``depth`` (>= 4) and ``num_heads``, and optionally
            ``mlp_ratio`` (default 4), ``local_kernel_size`` (default 3) and
            ``pos_hidden_dims`` (Fourier features per axis, default 32).
            Default: ``'small'``.
        in_channels (int): Image channels. Default: 3.
        out_indices (Sequence[int]): Outputs (0-3, strides 4, 8, 16, 32)
            returned. Default: (0, 1, 2, 3).
        qkv_bias (bool): Whether the QKV projections have biases.
            Default: True.
        drop_rate (float): Dropout after the position encoding, in the MLPs
            and after the attention projections. Default: 0.
        drop_path_rate (float): Stochastic depth rate, increasing linearly
            over the blocks. Default: 0.1.
        layer_scale_init_value (float): Initial value of the per-channel
            residual scales of every block (small, so that blocks start near
            the identity). Default: 1e-5.
        frozen_stages (int): -1 freezes nothing, 0 the patch embedding and
            position encoding, k >= 1 also the first k quarters of the blocks
            and their resampling branches. Default: -1.
        norm_eval (bool): Keep BatchNorm layers in eval mode. Default: False.
        with_cp (bool): Gradient checkpointing of blocks. Default: False.
        memory_efficient (bool): Train through the memory-efficient path
            (attention and LPI recompute their insides, MLPs their
            activations, the stem and pyramid their BatchNorm outputs) or,
            False, plain autograd; see
            :meth:`~.base.MultiStageBackbone.select_memory_path`. Default: True.
        recompute_mlp (bool): The MLP of every block also recomputes its
            hidden layer in backward (needs ``memory_efficient``). Default: False.
        init_cfg (dict, optional): Initialization config. With
            ``type='Pretrained'`` the checkpoint (optionally only the entries
            under ``prefix``) is loaded strictly: any missing (other than the
            stride-4/8 resampling branches), unexpected or mis-shaped entry
            raises ``ValueError`` listing them. Default: None.
    """

    def __init__(self,
                 arch: Union[str, dict] = 'small',
                 in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 layer_scale_init_value: float = 1e-5,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 memory_efficient: bool = True,
                 recompute_mlp: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(in_channels, NUM_STAGES, frozen_stages, norm_eval,
                         with_cp, min_input_size=32, init_cfg=init_cfg)
        settings = dict(ARCH_DEFAULTS)
        settings.update(resolve_arch(arch, ARCH_SETTINGS,
                                     ('embed_dims', 'depth', 'num_heads'),
                                     ARCH_DEFAULTS))
        self._check_arch(settings)
        check_positive_int('in_channels', in_channels)
        check_rate('drop_rate', drop_rate)
        check_rate('drop_path_rate', drop_path_rate)
        check_positive_float('layer_scale_init_value', layer_scale_init_value)
        self.out_indices = check_out_indices(out_indices, NUM_STAGES)
        self.arch_settings = settings
        self.embed_dims = dims = settings['embed_dims']
        self.depth = depth = settings['depth']
        self.stage_ends = [(k + 1) * depth // NUM_STAGES for k in range(NUM_STAGES)]

        self.patch_embed = ConvPatchEmbed(
            [in_channels, dims // 8, dims // 4, dims // 2, dims], STEM_STRIDES,
            act_layer=GELU, last_act=False)
        self.pos_embed = FourierPositionEncoding(dims, settings['pos_hidden_dims'])
        self.pos_drop = nn.Dropout(drop_rate)
        drop_path_rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(
            UFOBlock(dims, settings['num_heads'], settings['mlp_ratio'], qkv_bias,
                     drop_rate, rate, layer_scale_init_value,
                     settings['local_kernel_size']) for rate in drop_path_rates)
        self.pyramid = FeaturePyramidAdapter(dims, self.out_indices)
        self.select_memory_path(memory_efficient, recompute_mlp)

    @staticmethod
    def _check_arch(settings: dict) -> None:
        """Raises ``ValueError`` for an invalid architecture setting."""
        for key in ('embed_dims', 'depth', 'num_heads', 'local_kernel_size',
                    'pos_hidden_dims'):
            check_positive_int(f'arch[{key!r}]', settings[key])
        dims = settings['embed_dims']
        if dims % 8 != 0:
            raise ValueError(f"arch['embed_dims']={dims} is invalid; expected a "
                             f'multiple of 8 (the patch embedding widths are '
                             f'embed_dims/8, /4 and /2).')
        if settings['depth'] < NUM_STAGES:
            raise ValueError(f"arch['depth']={settings['depth']} is invalid; "
                             f'expected at least {NUM_STAGES} blocks, one per '
                             f'output.')
        check_divisible("arch['embed_dims']", [dims], "arch['num_heads']",
                        [settings['num_heads']])
        check_mlp_ratio("arch['mlp_ratio']", settings['mlp_ratio'], dims)

    def stage_parts(self, stage: int) -> List:
        """Stem (0) or the ``stage``-th quarter of blocks and its output branch."""
        if stage == 0:
            return [self.patch_embed, self.pos_embed]
        start = self.stage_ends[stage - 2] if stage > 1 else 0
        parts = list(self.blocks[start:self.stage_ends[stage - 1]])
        if str(stage - 1) in self.pyramid.branches:
            parts.append(self.pyramid.branches[str(stage - 1)])
        return parts

    def init_from_scratch(self) -> None:
        """Truncated-normal Linear weights; PyTorch defaults for convolutions."""
        self.apply(init_transformer_weights)

    # --- checkpoint loading (see mmsoft/checkpoint/backbone_loading.py) ---
    def load_pretrained(self, cfg: dict) -> None:
        """Loads the checkpoint strictly; only the stride-4/8 resampling
        branches may be missing."""
        load_ufo_vit_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                map_location=cfg.get('map_location', 'cpu'))

    def forward_features(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes]
                         ) -> Tuple[torch.Tensor, ...]:
        """Multi-scale features (see :meth:`~.base.MultiStageBackbone.forward`).

        With valid regions, the Fourier encoding follows each image's own
        grid, ``K^T V`` sums only its tokens, and the convolutions and the
        max pool see past its region what they see around it alone.

        Args:
            x (Tensor): Images, shape (B, in_channels, H, W).
            valid_shapes (list[tuple[int, int]] | None): Each image's valid
                (h, w) in pixels; None when all are valid.

        Returns:
            tuple[Tensor]: For each of ``out_indices``, a map with
            ``embed_dims`` channels at stride 4, 8, 16 or 32 (sizes in the
            class docstring).
        """
        batch = x.shape[0]
        x, hw_shape = self.patch_embed(x, valid_shapes)  # (B, N, C), N = h * w
        if valid_shapes is not None:
            valid_shapes = self.patch_embed.output_shapes(valid_shapes)
        pos = self.pos_embed(batch, hw_shape, x.device, valid_shapes)  # (B, C, h, w)
        x = self.pos_drop(x + pos.flatten(2).transpose(1, 2).to(x.dtype))
        read_after = [self.stage_ends[i] - 1 for i in self.out_indices]
        feats = []
        for i, block in enumerate(self.blocks[:read_after[-1] + 1]):
            x = self.run_block(block, x, hw_shape, valid_shapes)  # (B, N, C)
            if i in read_after:
                feats.append(tokens_to_map(x, hw_shape))
        return self.pyramid(feats, valid_shapes)
