"""SOFT / SOFT++: softmax-free transformer backbones for dense prediction."""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS

from ...utils import (check_choice, check_divisible, check_lengths,
                      check_out_indices, check_positive_int, check_rate,
                      resolve_arch)
from ..layers import (ConvPatchEmbed, SoftBlock, SoftmaxBlock, init_transformer_weights,
                      resize_pos_embed)
from ..layers.shared.layer_norm import LayerNormSavingOutput
from ..layers.shared.position import resize_pos_embed_to_regions
from ..layers.shared.valid_region import ValidShapes, mask_map
from ..layers.soft.kernel_inverse import SOLVERS, canonical_solver
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
ATTENTIONS = ('soft', 'soft++')
NUM_STAGES = 4


@MODELS.register_module()
class SOFT(MultiStageBackbone):
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
    mmdet/mmseg preprocessors) padding counts as image content, as before.

    The module tree holds the same parameters as the reference ImageNet
    models (classifier excluded), one to one, so their checkpoints map onto it.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'large'``,
            ``'huge'`` or a dict with ``embed_dims``, ``num_heads`` and
            ``depths`` (4 values each) and optionally ``sr_ratios``,
            ``local_kernel_sizes`` (3 values), ``mlp_ratios``,
            ``stem_channels``. Default: ``'tiny'``.
        attention (str): ``'soft'`` (regularised inverse) or ``'soft++'``
            (symmetric normalisation of the pseudo-inverse, the variant of
            the published COCO/ADE20K models). Default: ``'soft++'``.
        solver (str): How the bottleneck kernel is inverted:
            ``'newton'`` (``newton_iters`` steps of the reference
            Newton-Raphson iteration, the function every published
            checkpoint was trained with), ``'newton_closed_form'`` (the same
            function from one eigendecomposition, at about the cost of
            ``'exact'``) or ``'exact'`` (the iteration's limit: Cholesky for
            SOFT, pseudo-inverse for SOFT++; a different function wherever
            the kernel is ill-conditioned). ``'cholesky'`` is the former
            name of ``'exact'`` (deprecated). See
            :mod:`~mmsoft.models.layers.soft.kernel_inverse`. Default: ``'newton'``.
        newton_iters (int): Newton iterations of ``'newton'`` and
            ``'newton_closed_form'``. Default: 20.
        max_bottleneck_tokens (int, optional): Cap on bottleneck tokens per
            attention; larger bottleneck grids are average-pooled down to it,
            which keeps cost linear in the pixel count. Inputs up to 512x512
            are unaffected at the default. None disables the cap.
            Default: 256.
        kernel_chunk_tokens (int, optional): Stages with more tokens than
            this compute the query-bottleneck kernel chunk by chunk (forward
            and backward) instead of holding it whole, which bounds the
            attention's memory at large inputs. None always holds it.
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
        recompute_ffn (bool): In training, each FFN's backward recomputes its
            hidden layer (4C wide) from its input instead of keeping it, for
            one more matmul per FFN; nothing else is recomputed and outputs
            and gradients are unchanged. Default: False.
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
                 attention: str = 'soft++',
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
                 recompute_ffn: bool = False,
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
        check_choice('attention', attention, ATTENTIONS)
        solver = canonical_solver(solver)
        check_choice('solver', solver, SOLVERS)
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
        self.attention = attention
        self.solver = solver
        self.convert_weights = convert_weights
        self.embed_dims = list(settings['embed_dims'])

        self.patch_embeds = nn.ModuleList(self._patch_embed(i) for i in range(4))
        self.pos_grids = [(pretrain_img_size // 2**(i + 2), ) * 2 for i in range(4)]
        self.pos_embeds = nn.ParameterList(
            nn.Parameter(torch.zeros(1, math.prod(grid) + (i == 3), dims))
            for i, (grid, dims) in enumerate(zip(self.pos_grids, self.embed_dims)))
        self.pos_drop = nn.Dropout(drop_rate)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims[3]))

        depths = settings['depths']
        drop_path_rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        attn_kwargs = dict(variant=attention, solver=solver,
                           newton_iters=newton_iters,
                           max_bottleneck_tokens=max_bottleneck_tokens,
                           kernel_chunk_tokens=kernel_chunk_tokens)
        self.stages = nn.ModuleList()
        for i in range(NUM_STAGES):
            rates = drop_path_rates[sum(depths[:i]):sum(depths[:i + 1])]
            self.stages.append(nn.ModuleList(
                self._block(i, rate, attn_kwargs) for rate in rates))
        self.norm = LayerNormSavingOutput(self.embed_dims[3], eps=1e-6)
        self.recompute_ffn_hidden(recompute_ffn)

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
        if stage == NUM_STAGES:
            parts += [self.cls_token, self.norm]
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
        # Imported on use: mmsoft.checkpoint builds backbones to read shapes.
        from ...checkpoint import load_soft_checkpoint
        load_soft_checkpoint(self, cfg['checkpoint'],
                             convert_weights=self.convert_weights,
                             prefix=cfg.get('prefix'),
                             map_location=cfg.get('map_location', 'cpu'))

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
            Tensor: (1 or B, H * W, C), or (1 or B, 1 + H * W, C) with the
            class token's entry first in the last stage.
        """
        pos_embed = self.pos_embeds[stage]
        has_cls = stage == NUM_STAGES - 1
        grid_embed = pos_embed[:, 1:] if has_cls else pos_embed
        if valid_shapes is None:
            grid = resize_pos_embed(grid_embed, self.pos_grids[stage], hw_shape)
        else:
            grid = resize_pos_embed_to_regions(grid_embed, self.pos_grids[stage],
                                               hw_shape, valid_shapes)
        if not has_cls:
            return grid
        return torch.cat((pos_embed[:, :1].expand(grid.shape[0], -1, -1), grid), dim=1)

    def forward(self, x: torch.Tensor,
                valid_shapes: Optional[Sequence[Tuple[int, int]]] = None
                ) -> Tuple[torch.Tensor, ...]:
        """Multi-scale features.

        Valid regions are optional (see
        :meth:`~.base.MultiStageBackbone.resolve_valid_shapes`); with none,
        padding is image content, as it always was. With them, position
        embeddings are resized to each image's grid, SOFT and softmax
        attention ignore padded tokens and convolutions see zeros past the
        regions, so an image's features are those it has alone; the maps
        are zero outside the regions.

        Args:
            x (Tensor): Images, shape (B, in_channels, H, W), H, W >= 32.
            valid_shapes (Sequence[tuple[int, int]], optional): Each image's
                valid (h, w) in pixels, the top-left region of its canvas.
                Default: None (the record for ``x``, if any; else all valid).

        Returns:
            tuple[Tensor]: For each of ``out_indices``, a map of shape
            (B, embed_dims[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2))).
        """
        self.check_input(x)
        valid_shapes = self.resolve_valid_shapes(x, valid_shapes)
        batch = x.shape[0]
        outs = []
        for i in range(NUM_STAGES):
            x, hw_shape = self.patch_embeds[i](x, valid_shapes)  # (B, N, C)
            if valid_shapes is not None:
                valid_shapes = self.patch_embeds[i].output_shapes(valid_shapes)
            if i == NUM_STAGES - 1:
                x = torch.cat((self.cls_token.expand(batch, -1, -1), x), dim=1)
            x = self.pos_drop(x + self.stage_pos_embed(i, hw_shape, valid_shapes))
            for block in self.stages[i]:
                x = self.run_block(block, x, hw_shape, valid_shapes)
            if i == NUM_STAGES - 1:
                x = self.norm(x)[:, 1:]
            x = mask_map(tokens_to_map(x, hw_shape), valid_shapes)  # (B, C, H, W)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
