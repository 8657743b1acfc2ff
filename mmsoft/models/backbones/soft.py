"""SOFT / SOFT++: softmax-free transformer backbones for dense prediction."""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS

from ...checkpoint import load_soft_checkpoint
from ...utils import (check_divisible, check_lengths, check_out_indices,
                      check_positive_int, check_rate, resolve_arch)
from ..layers import (ConvPatchEmbed, SoftBlock, SoftmaxBlock, init_transformer_weights,
                      resize_pos_embed)
from ..layers.shared.position import interpolate_pos_embed, resize_pos_embed_to_regions
from ..ops.kernel_inverse import check_kernel_inverse_options
from ..ops.valid_region import ValidShapes, mask_map
from ..tracing import Exportable
from .base import MultiStageBackbone, tokens_to_map

ARCH_SETTINGS = {
    'tiny': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                 depths=[1, 2, 3, 2]),
    # The reference code's depths (38.9M parameters with the classifier), so
    # that its checkpoints load; its README quotes 24M for "small".
    'small': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                  depths=[1, 3, 20, 4]),
    'medium': dict(embed_dims=[64, 128, 288, 512], num_heads=[2, 4, 9, 16],
                   depths=[1, 3, 29, 5]),
    'large': dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16],
                  depths=[1, 3, 40, 5]),
    'huge': dict(embed_dims=[64, 128, 352, 512], num_heads=[2, 4, 11, 16],
                 depths=[1, 5, 49, 5]),
}
ARCH_DEFAULTS = dict(
    sr_ratios=[8, 4, 2, 1],
    local_kernel_sizes=[9, 5, 3],
    mlp_ratios=[4, 4, 4, 4],
    stem_channels=32,
)
NUM_STAGES = 4
#: The stage whose token sequence starts with the class token, ``[cls; grid]``
#: (dropped from its output map); its position embeddings ``pos_embeds[3]``
#: hold the class token's entry first, then the grid's.
CLASS_TOKEN_STAGE = NUM_STAGES - 1


@MODELS.register_module()
class SOFT(MultiStageBackbone, Exportable):
    """SOFT / SOFT++ backbone (Lu et al., NeurIPS 2021 / IJCV 2024).

    Four stages at strides 4, 8, 16 and 32. Stages 1-3 use softmax-free
    Gaussian-kernel attention (:class:`~mmsoft.models.layers.SoftAttention`)
    in post-norm blocks; stage 4 is a softmax-attention block with a class
    token (dropped from the output). Overlapping stride-2 convolutions embed
    the patches, so stage ``i`` (0-based) of an H x W image is
    ``ceil(H / 2**(i + 2)) x ceil(W / 2**(i + 2))``; learned position
    embeddings are bilinearly resized to it at every forward.

    Padded batches: told each image's valid region (``forward``'s
    ``valid_shapes`` or a valid-region data preprocessor), an image's
    features do not depend on its batch's padding; without it (the plain
    mmdet/mmseg preprocessors) padding counts as image content.

    The module tree holds the same parameters as the reference ImageNet
    models (classifier excluded), one to one, so their checkpoints map onto it.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'large'``,
            ``'huge'`` or a dict with ``embed_dims``, ``num_heads`` and
            ``depths`` (4 values each) and optionally ``sr_ratios``,
            ``local_kernel_sizes`` (3 values), ``mlp_ratios``,
            ``stem_channels``. Default: ``'tiny'``.
        variant (str): ``'soft'`` (regularised inverse) or ``'soft++'``
            (symmetric normalisation of the pseudo-inverse, the variant of
            the published COCO/ADE20K models). Default: ``'soft++'``.
        solver (str): How the bottleneck kernel is inverted: ``'newton'``
            (``newton_iters`` steps of the reference Newton-Raphson
            iteration), ``'newton_closed_form'`` (the same function from one
            eigendecomposition) or ``'exact'`` (the iteration's limit); see
            :mod:`~mmsoft.models.ops.kernel_inverse` and
            ``docs/soft_design.md``. ``'cholesky'`` is a deprecated alias of
            ``'exact'``. Default: ``'newton'``.
        newton_iters (int): Newton iterations of ``'newton'`` and
            ``'newton_closed_form'``. Default: 20.
        max_bottleneck_tokens (int, optional): Cap on bottleneck tokens per
            attention; larger bottleneck grids are average-pooled down to it,
            which keeps cost linear in the pixel count. Inputs up to 512x512
            are unaffected at the default. None disables the cap.
            Default: 256.
        kernel_chunk_tokens (int, optional): Most rows of the
            query-bottleneck kernel that SOFT attention's memory-efficient
            implementation holds at a time (forward and backward). None: all.
            Default: 16384.
        in_channels (int): Image channels. Default: 3.
        pretrain_img_size (int): Image size the position embeddings are
            learned for. Default: 224.
        out_indices (Sequence[int]): Stages (0-3) whose maps are returned.
            Default: (0, 1, 2, 3).
        drop_rate (float): Dropout after adding position embeddings.
            Default: 0.
        drop_path_rate (float): Stochastic depth rate, increasing linearly
            over all blocks. Default: 0.1.
        frozen_stages (int): -1 freezes nothing, 0 the first patch embedding,
            k >= 1 stages 1..k. Default: -1.
        norm_eval (bool): Keep BatchNorm in eval mode. Default: False.
        with_cp (bool): Gradient checkpointing of blocks. Default: False.
        memory_efficient (bool): Train through the memory-efficient path
            (SOFT attention then keeps neither Gaussian kernel for backward)
            or, False, plain autograd; see
            :meth:`~.base.MultiStageBackbone.select_memory_path`. Default: True.
        recompute_mlp (bool): MLPs also recompute their hidden layer in
            backward (needs ``memory_efficient``; same method). Default: False.
        convert_weights (bool): ``init_cfg=dict(type='Pretrained',
            checkpoint=...)`` names a reference (official) SOFT / SOFT++
            ImageNet checkpoint, converted while loading (see
            :mod:`~mmsoft.checkpoint.soft_official`). Default: False.
        init_cfg (dict, optional): Initialization config. With
            ``type='Pretrained'`` the checkpoint (optionally only the entries
            under ``prefix``) is loaded strictly: position embeddings learned
            at another image size are resized, any other missing, unexpected
            or mis-shaped entry raises ``ValueError``. Default: None.
    """

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 variant: str = 'soft++',
                 solver: str = 'newton',
                 newton_iters: int = 20,
                 max_bottleneck_tokens: Optional[int] = 256,
                 kernel_chunk_tokens: Optional[int] = 16384,
                 in_channels: int = 3,
                 pretrain_img_size: int = 224,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 memory_efficient: bool = True,
                 recompute_mlp: bool = False,
                 convert_weights: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(in_channels, NUM_STAGES, frozen_stages, norm_eval,
                         with_cp, min_input_size=32, init_cfg=init_cfg)
        settings = resolve_arch(arch, ARCH_SETTINGS,
                                ('embed_dims', 'num_heads', 'depths'), ARCH_DEFAULTS)
        check_lengths(settings, ('embed_dims', 'num_heads', 'depths', 'sr_ratios',
                                 'mlp_ratios'), NUM_STAGES)
        check_lengths(settings, ('local_kernel_sizes', ), NUM_STAGES - 1)
        check_divisible('embed_dims', settings['embed_dims'], 'num_heads',
                        settings['num_heads'])
        solver = check_kernel_inverse_options(variant, solver)
        check_positive_int('newton_iters', newton_iters)
        check_positive_int('max_bottleneck_tokens', max_bottleneck_tokens,
                           allow_none=True)
        check_positive_int('kernel_chunk_tokens', kernel_chunk_tokens,
                           allow_none=True)
        check_positive_int('in_channels', in_channels)
        check_positive_int('pretrain_img_size', pretrain_img_size)
        check_rate('drop_rate', drop_rate)
        check_rate('drop_path_rate', drop_path_rate)
        self.out_indices = check_out_indices(out_indices, NUM_STAGES)
        self.arch_settings = settings
        self.variant = variant
        self.solver = solver
        self.convert_weights = convert_weights
        self.embed_dims = list(settings['embed_dims'])

        self.patch_embeds = nn.ModuleList(self._patch_embed(i) for i in range(4))
        self.pos_grids = [(pretrain_img_size // 2**(i + 2), ) * 2 for i in range(4)]
        self.pos_embeds = nn.ParameterList(
            nn.Parameter(torch.zeros(1, self.extra_tokens(i) + math.prod(grid), dims))
            for i, (grid, dims) in enumerate(zip(self.pos_grids, self.embed_dims)))
        self.pos_drop = nn.Dropout(drop_rate)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims[3]))

        depths = settings['depths']
        drop_path_rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        attn_kwargs = dict(variant=variant, solver=solver,
                           newton_iters=newton_iters,
                           max_bottleneck_tokens=max_bottleneck_tokens,
                           kernel_chunk_tokens=kernel_chunk_tokens)
        self.stages = nn.ModuleList()
        for i in range(NUM_STAGES):
            rates = drop_path_rates[sum(depths[:i]):sum(depths[:i + 1])]
            self.stages.append(nn.ModuleList(
                self._block(i, rate, attn_kwargs) for rate in rates))
        self.norm = nn.LayerNorm(self.embed_dims[3], eps=1e-6)
        self.select_memory_path(memory_efficient, recompute_mlp)

    def _patch_embed(self, stage: int) -> ConvPatchEmbed:
        """Stage 1: three convs (strides 2, 1, 2); later stages: one stride-2 conv."""
        dims = self.embed_dims[stage]
        if stage == 0:
            stem = self.arch_settings['stem_channels']
            return ConvPatchEmbed([self.in_channels, stem, stem, dims], [2, 1, 2])
        return ConvPatchEmbed([self.embed_dims[stage - 1], dims], [2])

    def _block(self, stage: int, drop_path: float, attn_kwargs: dict) -> nn.Module:
        settings = self.arch_settings
        dims, heads = self.embed_dims[stage], settings['num_heads'][stage]
        mlp_ratio = settings['mlp_ratios'][stage]
        if stage == NUM_STAGES - 1:
            return SoftmaxBlock(dims, heads, mlp_ratio, drop_path)
        return SoftBlock(dims, heads, settings['sr_ratios'][stage],
                         settings['local_kernel_sizes'][stage], mlp_ratio,
                         drop_path, **attn_kwargs)

    def stage_parts(self, stage: int) -> List:
        """Stem (0) or everything of stage ``stage`` (1-4)."""
        if stage == 0:
            return [self.patch_embeds[0]]
        i = stage - 1
        parts = [self.patch_embeds[i], self.pos_embeds[i], self.stages[i]]
        if i == CLASS_TOKEN_STAGE:
            parts.append(self.cls_token)
        if stage == NUM_STAGES:
            parts.append(self.norm)
        return parts

    def init_from_scratch(self) -> None:
        """Truncated-normal position embeddings, class token and Linear weights."""
        for pos_embed in self.pos_embeds:
            trunc_normal_(pos_embed, std=.02)
        trunc_normal_(self.cls_token, std=.02)
        self.apply(init_transformer_weights)

    # --- checkpoint loading (see mmsoft/checkpoint/backbone_loading.py) ---
    def load_pretrained(self, cfg: dict) -> None:
        """Loads the checkpoint strictly, converting reference checkpoints
        when ``convert_weights``."""
        grids = {f'pos_embeds.{i}': (tuple(grid), self.extra_tokens(i))
                 for i, grid in enumerate(self.pos_grids)}
        load_soft_checkpoint(self, cfg['checkpoint'],
                             convert_weights=self.convert_weights,
                             prefix=cfg.get('prefix'),
                             map_location=cfg.get('map_location', 'cpu'),
                             pos_embed_grids=grids, variant=self.variant)

    # --- the class token (stage 4): its token and its position embedding ---
    @staticmethod
    def extra_tokens(stage: int) -> int:
        """Tokens before the grid in stage ``stage`` (0-3): 1 (the class
        token) in :data:`CLASS_TOKEN_STAGE`, else 0."""
        return int(stage == CLASS_TOKEN_STAGE)

    def stage_pos_embed(self, stage: int, hw_shape: Tuple[int, int],
                        valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """Position embeddings of stage ``stage`` resized to ``hw_shape``.

        Args:
            stage (int): 0-3.
            hw_shape (tuple[int, int]): The stage's token grid (H, W).
            valid_shapes (list[tuple[int, int]], optional): Each image's
                valid region of the grid; the embeddings are then resized to
                each region and zero outside it. Default: None.

        Returns:
            Tensor: (1 or B, extra + H * W, C) with ``extra =``
            :meth:`extra_tokens` entries (the class token's) first.
        """
        extra = self.extra_tokens(stage)
        pos_embed = self.pos_embeds[stage]
        grid_embed = pos_embed[:, extra:]
        if valid_shapes is None:
            # Exported, the resize runs on every grid, its own included.
            resize = interpolate_pos_embed if self.exportable else resize_pos_embed
            grid = resize(grid_embed, self.pos_grids[stage], hw_shape)
        else:
            grid = resize_pos_embed_to_regions(grid_embed, self.pos_grids[stage],
                                               hw_shape, valid_shapes)
        if not extra:
            return grid
        extra_embed = pos_embed[:, :extra].expand(grid.shape[0], -1, -1)
        return torch.cat((extra_embed, grid), dim=1)

    def stage_tokens(self, stage: int, patches: torch.Tensor, hw_shape: Tuple[int, int],
                     valid_shapes: Optional[ValidShapes] = None) -> torch.Tensor:
        """The tokens stage ``stage``'s blocks run on: the class token (in
        :data:`CLASS_TOKEN_STAGE`) and the patches, plus position embeddings.

        Args:
            stage (int): 0-3.
            patches (Tensor): Patch tokens, shape (B, H * W, C).
            hw_shape (tuple[int, int]): Their grid (H, W).
            valid_shapes (list[tuple[int, int]], optional): Valid regions of
                the grid (see :meth:`stage_pos_embed`). Default: None.

        Returns:
            Tensor: Shape (B, extra + H * W, C).
        """
        if self.extra_tokens(stage):
            cls_token = self.cls_token.expand(patches.shape[0], -1, -1)  # (B, 1, C)
            patches = torch.cat((cls_token, patches), dim=1)
        pos_embed = self.stage_pos_embed(stage, hw_shape, valid_shapes)
        return self.pos_drop(patches + pos_embed)

    def forward_features(self, x: torch.Tensor, valid_shapes: Optional[ValidShapes]
                         ) -> Tuple[torch.Tensor, ...]:
        """Multi-scale features (see :meth:`~.base.MultiStageBackbone.forward`).

        With valid regions, position embeddings are resized to each image's
        grid, SOFT and softmax attention ignore padded tokens and
        convolutions see zeros past the regions.

        Args:
            x (Tensor): Images, shape (B, in_channels, H, W).
            valid_shapes (list[tuple[int, int]] | None): Each image's valid
                (h, w) in pixels; None when all are valid.

        Returns:
            tuple[Tensor]: For each of ``out_indices``, a map of shape
            (B, embed_dims[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2))).
        """
        outs = []
        for i in range(NUM_STAGES):
            x, hw_shape = self.patch_embeds[i](x, valid_shapes)  # (B, N, C)
            if valid_shapes is not None:
                valid_shapes = self.patch_embeds[i].output_shapes(valid_shapes)
            x = self.stage_tokens(i, x, hw_shape, valid_shapes)  # (B, extra + N, C)
            for block in self.stages[i]:
                x = self.run_block(block, x, hw_shape, valid_shapes)
            if i == NUM_STAGES - 1:
                x = self.norm(x)
            x = x[:, self.extra_tokens(i):]  # the grid's tokens, (B, N, C)
            x = mask_map(tokens_to_map(x, hw_shape), valid_shapes)  # (B, C, H, W)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
