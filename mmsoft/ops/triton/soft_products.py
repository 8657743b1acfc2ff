"""SOFT's kernel products ``K1 . (middle . (K1^T V))``, forward and backward.

Per image and head, with the queries Q = s Q0 (N, d), the bottleneck tokens
L (m, d) and the Gaussian kernel ``K1 = exp(E)``,
``E = Q L^T - |Q|^2 / 2 - |L|^2 / 2`` (N, m): ``S = K1^T V``, ``R = middle S``
and ``out = K1 R``, right to left in O(N m d). The kernels recompute K1 tile
by tile from Q and L and never store it. A sum over the tokens runs in
parallel over splits of them: each split stores its partial sum, and the next
kernel adds the partials in a fixed order (deterministic, no atomics).

Forward, 3 launches: the partials of ``K1^T V``; their sum S and
``R = middle S``; ``out = K1 R``. Backward, 4 launches: the partials of
``dR = K1^T G``; ``d middle = dR S^T`` and ``dS = middle^T dR``; dV and dQ0
on tiles of tokens, and the partials of dL, in one launch; the sum of those.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl

from . import dot_precision

#: The kernels each host function launches (Triton's and torch's).
LAUNCHES = {'products_forward': 3, 'products_backward': 4}
#: Token splits are chosen to give about this many programs in all: two per
#: SM of an H100 (132 SMs); more would grow the partials that the next kernel
#: adds up, fewer would leave SMs idle.
TARGET_PROGRAMS = 256
#: Tile sides: tokens, and bottleneck tokens (a loop runs over m). Under
#: torch's default float32 matmul precision, ``tl.dot`` runs on the CUDA cores
#: (FMA), whose operands take registers in proportion to the tile: in float32
#: these tiles compile for sm_80 and sm_90 without spilling registers.
TOKEN_TILE = 64
BOTTLENECK_TILE = 32
#: The backward's main kernel holds more tiles at once: fewer tokens per
#: tile, and no software pipelining of its loads (its registers would spill).
GRADIENT_TOKEN_TILE = 32
GRADIENT_STAGES = 1
#: Partials added per load when summing over the splits.
SPLIT_TILE = 4
NUM_WARPS = 4


# --- Tiles
@triton.jit
def _head_offset(bh, heads, stride_b, stride_h):
    """The offset of image ``bh // heads``, head ``bh % heads`` (int64)."""
    image = (bh // heads).to(tl.int64)
    head = (bh % heads).to(tl.int64)
    return image * stride_b + head * stride_h


@triton.jit
def _tile_offsets(rows, cols, stride_row, stride_col, n_rows, n_cols):
    """Offsets of the tile (rows, cols) of an (n_rows, n_cols) matrix, and
    its mask."""
    offsets = rows[:, None] * stride_row + cols[None, :] * stride_col
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return offsets, mask


@triton.jit
def _load_tile(ptr, rows, cols, stride_row, stride_col, n_rows, n_cols):
    """The tile (rows, cols) of an (n_rows, n_cols) matrix, zero outside it."""
    offsets, mask = _tile_offsets(rows, cols, stride_row, stride_col, n_rows, n_cols)
    return tl.load(ptr + offsets, mask=mask, other=0.)


@triton.jit
def _store_tile(ptr, tile, rows, cols, stride_row, stride_col, n_rows, n_cols):
    """Stores the part of ``tile`` (rows, cols) inside an (n_rows, n_cols) matrix."""
    offsets, mask = _tile_offsets(rows, cols, stride_row, stride_col, n_rows, n_cols)
    tl.store(ptr + offsets, tile, mask=mask)


@triton.jit
def _sum_splits(ptr, stride_split, splits, rows, cols, n_rows, n_cols,
                BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                SPLIT_BLOCK: tl.constexpr):
    """The sum over the splits of the partials ``ptr[split, rows, cols]``, each
    an (n_rows, n_cols) row-major matrix: (BLOCK_R, BLOCK_D), in a fixed order.

    ``SPLIT_BLOCK`` partials are loaded at a time, so that a program waits on
    splits / SPLIT_BLOCK loads rather than on one load per split."""
    offsets, mask = _tile_offsets(rows, cols, n_cols, 1, n_rows, n_cols)
    parts = tl.arange(0, SPLIT_BLOCK)
    total = tl.zeros((BLOCK_R, BLOCK_D), dtype=ptr.dtype.element_ty)
    for first in range(0, splits, SPLIT_BLOCK):
        split = first + parts
        pointers = ptr + split[:, None, None] * stride_split + offsets[None, :, :]
        valid = (split < splits)[:, None, None] & mask[None, :, :]
        total += tl.sum(tl.load(pointers, mask=valid, other=0.), 0)
    return total


# --- The Gaussian kernel, tile by tile
@triton.jit
def _scaled(tile, scale):
    """``scale * tile`` in the tile's dtype. The scale is a float64 argument
    (Triton would pass a Python float as float32), so a float64 tile is scaled
    exactly; one multiply per element of a (tokens, d) tile."""
    return (tile * scale).to(tile.dtype)


@triton.jit
def _queries_tile(ptr, tokens, cols, stride_n, stride_d, n_tokens, dims, scale):
    """Q = s Q0 on ``tokens`` (BLOCK_N, BLOCK_D) and |Q|^2 / 2 (BLOCK_N,)."""
    queries = _load_tile(ptr, tokens, cols, stride_n, stride_d, n_tokens, dims)
    queries = _scaled(queries, scale)
    return queries, 0.5 * tl.sum(queries * queries, 1)


@triton.jit
def _bottleneck_tile(ptr, rows, cols, stride_m, stride_d, m, dims):
    """L on ``rows`` (BLOCK_M, BLOCK_D) and |L|^2 / 2 (BLOCK_M,)."""
    bottleneck = _load_tile(ptr, rows, cols, stride_m, stride_d, m, dims)
    return bottleneck, 0.5 * tl.sum(bottleneck * bottleneck, 1)


@triton.jit
def _kernel_tile(queries, queries_half_norm, bottleneck, bottleneck_half_norm,
                 PRECISION: tl.constexpr):
    """``K1 = exp(Q L^T - |Q|^2 / 2 - |L|^2 / 2)`` of a tile: (BLOCK_N, BLOCK_M).

    Padding tokens and padding bottleneck rows load as zeros, so their K1 is
    finite; the V, G, R and dS rows it meets there are zeros too, so it adds
    nothing to any sum."""
    exponent = tl.dot(queries, tl.trans(bottleneck), input_precision=PRECISION)
    return tl.exp(exponent - queries_half_norm[:, None]
                  - bottleneck_half_norm[None, :])


@triton.jit
def _token_rows(queries_ptr, stride_qn, stride_qd, grad_out_ptr, stride_gn, stride_gd,
                values_ptr, stride_vn, stride_vd, tokens, cols, n_tokens, dims, scale):
    """Q = s Q0, |Q|^2 / 2, G and V on ``tokens``: (BLOCK_N, BLOCK_D) each but
    the norm (BLOCK_N,)."""
    queries, queries_half_norm = _queries_tile(
        queries_ptr, tokens, cols, stride_qn, stride_qd, n_tokens, dims, scale)
    grad_out = _load_tile(grad_out_ptr, tokens, cols, stride_gn, stride_gd,
                          n_tokens, dims)
    values = _load_tile(values_ptr, tokens, cols, stride_vn, stride_vd, n_tokens, dims)
    return queries, queries_half_norm, grad_out, values


@triton.jit
def _bottleneck_rows(bottleneck_ptr, stride_lm, stride_ld, factor_ptr, stride_rm,
                     stride_rd, grad_summary_ptr, stride_sm, stride_sd, rows, cols,
                     m, dims):
    """L, |L|^2 / 2, R and dS on ``rows``: (BLOCK_M, BLOCK_D) each but the
    norm (BLOCK_M,)."""
    bottleneck, bottleneck_half_norm = _bottleneck_tile(
        bottleneck_ptr, rows, cols, stride_lm, stride_ld, m, dims)
    factor = _load_tile(factor_ptr, rows, cols, stride_rm, stride_rd, m, dims)
    grad_summary = _load_tile(grad_summary_ptr, rows, cols, stride_sm, stride_sd,
                              m, dims)
    return bottleneck, bottleneck_half_norm, factor, grad_summary


@triton.jit
def _grad_exponent_tile(queries, queries_half_norm, grad_out, values, bottleneck,
                        bottleneck_half_norm, factor, grad_summary,
                        PRECISION: tl.constexpr):
    """K1 and ``dE = (G R^T + V dS^T) o K1`` of a tile: (BLOCK_N, BLOCK_M) each."""
    kernel = _kernel_tile(queries, queries_half_norm, bottleneck, bottleneck_half_norm,
                          PRECISION)
    grad_kernel = (tl.dot(grad_out, tl.trans(factor), input_precision=PRECISION)
                   + tl.dot(values, tl.trans(grad_summary), input_precision=PRECISION))
    return kernel, grad_kernel * kernel


# --- Kernels
@triton.jit
def _token_sum_kernel(
        queries_ptr, stride_qb, stride_qh, stride_qn, stride_qd,
        bottleneck_ptr, stride_lb, stride_lh, stride_lm, stride_ld,
        values_ptr, stride_vb, stride_vh, stride_vn, stride_vd,
        partials_ptr, stride_pb, stride_ps,
        heads, n_tokens, m, dims, tiles_per_split, scale: tl.float64,
        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr):
    """One split's part of ``K1^T X`` for one block of bottleneck rows:
    ``partials[bh, split, rows]`` (BLOCK_M, d). X is V in the forward (S) and
    G in the backward (dR).

    Grid (splits, m / BLOCK_M, B * h); the split's tiles of tokens in a loop."""
    split = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(2)
    cols = tl.arange(0, BLOCK_D)
    queries_ptr += _head_offset(bh, heads, stride_qb, stride_qh)
    bottleneck_ptr += _head_offset(bh, heads, stride_lb, stride_lh)
    values_ptr += _head_offset(bh, heads, stride_vb, stride_vh)

    bottleneck, bottleneck_half_norm = _bottleneck_tile(
        bottleneck_ptr, rows, cols, stride_lm, stride_ld, m, dims)  # (BLOCK_M, BLOCK_D)
    total = tl.zeros((BLOCK_M, BLOCK_D), dtype=queries_ptr.dtype.element_ty)
    first = split * tiles_per_split * BLOCK_N
    for tile in range(tiles_per_split):
        tokens = first + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        queries, queries_half_norm = _queries_tile(
            queries_ptr, tokens, cols, stride_qn, stride_qd, n_tokens, dims, scale)
        kernel = _kernel_tile(queries, queries_half_norm, bottleneck,
                              bottleneck_half_norm, PRECISION)  # (BLOCK_N, BLOCK_M)
        values = _load_tile(values_ptr, tokens, cols, stride_vn, stride_vd,
                            n_tokens, dims)  # (BLOCK_N, BLOCK_D)
        total += tl.dot(tl.trans(kernel), values, input_precision=PRECISION)

    partials_ptr += bh * stride_pb + split * stride_ps
    _store_tile(partials_ptr, total, rows, cols, dims, 1, m, dims)


@triton.jit
def _middle_kernel(
        partials_ptr, stride_pb, stride_ps, splits,
        middle_ptr, stride_ab, stride_ah, stride_ai, stride_ak,
        summary_ptr, stride_sb, stride_sh, stride_sm, stride_sd,
        product_ptr, stride_rb, stride_rh, stride_rm, stride_rd,
        grad_middle_ptr, stride_gb, stride_gh, stride_gi, stride_gk,
        heads, m, dims, BACKWARD: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
        PRECISION: tl.constexpr):
    """Rows ``i`` of ``A X`` (BLOCK_M, d), X (m, d) the sum of the partials.

    Forward: X = S, A = middle, the product is R; the program stores S's rows
    ``i`` as it adds them up. Backward: X = dR, A = middle^T (the strides
    swapped), the product is dS; the program stores the column block ``i`` of
    ``d middle = dR S^T``, ``dR_k S_i^T`` for each row block k of dR.

    Grid (m / BLOCK_M, B * h); X's row blocks in a loop, each the sum of its
    partials."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    partials_ptr += bh * stride_pb
    middle_ptr += _head_offset(bh, heads, stride_ab, stride_ah)
    summary_ptr += _head_offset(bh, heads, stride_sb, stride_sh)
    grad_middle_ptr += _head_offset(bh, heads, stride_gb, stride_gh)
    if BACKWARD:
        summary = _load_tile(summary_ptr, rows, cols, stride_sm, stride_sd,
                             m, dims)  # S_i: (BLOCK_M, BLOCK_D)

    product = tl.zeros((BLOCK_M, BLOCK_D), dtype=partials_ptr.dtype.element_ty)
    for first in range(0, m, BLOCK_M):
        others = first + tl.arange(0, BLOCK_M)
        reduced = _sum_splits(partials_ptr, stride_ps, splits, others, cols, m, dims,
                              BLOCK_M, BLOCK_D, SPLIT_BLOCK)  # X_k
        matrix = _load_tile(middle_ptr, rows, others, stride_ai, stride_ak, m, m)
        product += tl.dot(matrix, reduced, input_precision=PRECISION)
        if BACKWARD:
            grad_middle = tl.dot(reduced, tl.trans(summary),
                                 input_precision=PRECISION)  # dR_k S_i^T
            _store_tile(grad_middle_ptr, grad_middle, others, rows, stride_gi,
                        stride_gk, m, m)
        elif first == tl.program_id(0) * BLOCK_M:
            _store_tile(summary_ptr, reduced, others, cols, stride_sm, stride_sd,
                        m, dims)

    product_ptr += _head_offset(bh, heads, stride_rb, stride_rh)
    _store_tile(product_ptr, product, rows, cols, stride_rm, stride_rd, m, dims)


@triton.jit
def _apply_kernel(
        queries_ptr, stride_qb, stride_qh, stride_qn, stride_qd,
        bottleneck_ptr, stride_lb, stride_lh, stride_lm, stride_ld,
        factor_ptr, stride_rb, stride_rh, stride_rm, stride_rd,
        out_ptr, stride_ob, stride_oh, stride_on, stride_od,
        heads, n_tokens, m, dims, scale: tl.float64,
        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr):
    """``out = K1 R`` on one tile of tokens (BLOCK_N, d).

    Grid (N / BLOCK_N, B * h); the blocks of bottleneck rows in a loop."""
    tokens = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    bh = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    queries_ptr += _head_offset(bh, heads, stride_qb, stride_qh)
    bottleneck_ptr += _head_offset(bh, heads, stride_lb, stride_lh)
    factor_ptr += _head_offset(bh, heads, stride_rb, stride_rh)

    queries, queries_half_norm = _queries_tile(
        queries_ptr, tokens, cols, stride_qn, stride_qd, n_tokens, dims, scale)
    out = tl.zeros((BLOCK_N, BLOCK_D), dtype=queries_ptr.dtype.element_ty)
    for first in range(0, m, BLOCK_M):
        rows = first + tl.arange(0, BLOCK_M)
        bottleneck, bottleneck_half_norm = _bottleneck_tile(
            bottleneck_ptr, rows, cols, stride_lm, stride_ld, m, dims)
        kernel = _kernel_tile(queries, queries_half_norm, bottleneck,
                              bottleneck_half_norm, PRECISION)  # (BLOCK_N, BLOCK_M)
        factor = _load_tile(factor_ptr, rows, cols, stride_rm, stride_rd, m, dims)
        out += tl.dot(kernel, factor, input_precision=PRECISION)

    out_ptr += _head_offset(bh, heads, stride_ob, stride_oh)
    _store_tile(out_ptr, out, tokens, cols, stride_on, stride_od, n_tokens, dims)


@triton.jit
def _gradients_kernel(
        queries_ptr, stride_qb, stride_qh, stride_qn, stride_qd,
        values_ptr, stride_vb, stride_vh, stride_vn, stride_vd,
        grad_out_ptr, stride_gb, stride_gh, stride_gn, stride_gd,
        bottleneck_ptr, stride_lb, stride_lh, stride_lm, stride_ld,
        factor_ptr, stride_rb, stride_rh, stride_rm, stride_rd,
        grad_summary_ptr, stride_sb, stride_sh, stride_sm, stride_sd,
        grad_queries_ptr, stride_dqb, stride_dqh, stride_dqn, stride_dqd,
        grad_values_ptr, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        partials_ptr, stride_pb, stride_ps,
        heads, n_tokens, m, dims, splits, row_blocks, tiles_per_split,
        scale: tl.float64, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """One split's part of dL on one block of bottleneck rows, or dV and dQ0
    on one tile of tokens.

    With ``dE = (G R^T + V dS^T) o K1``: the partial ``dE^T Q - colsum(dE) o L``
    (BLOCK_M, d) over the split's tokens, ``dV = K1 dS`` and
    ``dQ0 = s (dE L - rowsum(dE) o Q)``.

    Grid (splits * row_blocks + token_tiles, B * h). The first splits *
    row_blocks programs loop over their split's tiles of tokens, the others
    over the blocks of bottleneck rows. Both evaluate dE, so it is computed
    twice, but no program holds more than one (BLOCK_N, BLOCK_M) tile. The
    longer programs, those of dL, come first so that they start first."""
    program = tl.program_id(0)
    bh = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    queries_ptr += _head_offset(bh, heads, stride_qb, stride_qh)
    values_ptr += _head_offset(bh, heads, stride_vb, stride_vh)
    grad_out_ptr += _head_offset(bh, heads, stride_gb, stride_gh)
    bottleneck_ptr += _head_offset(bh, heads, stride_lb, stride_lh)
    factor_ptr += _head_offset(bh, heads, stride_rb, stride_rh)
    grad_summary_ptr += _head_offset(bh, heads, stride_sb, stride_sh)
    dtype = queries_ptr.dtype.element_ty

    if program < splits * row_blocks:  # a split's part of dL on a block of rows
        split = program // row_blocks
        rows = program % row_blocks * BLOCK_M + tl.arange(0, BLOCK_M)
        bottleneck, bottleneck_half_norm, factor, grad_summary = _bottleneck_rows(
            bottleneck_ptr, stride_lm, stride_ld, factor_ptr, stride_rm, stride_rd,
            grad_summary_ptr, stride_sm, stride_sd, rows, cols, m, dims)
        grad_bottleneck = tl.zeros((BLOCK_M, BLOCK_D), dtype=dtype)
        column_sum = tl.zeros((BLOCK_M,), dtype=dtype)
        first = split * tiles_per_split * BLOCK_N
        for tile in range(tiles_per_split):
            tokens = first + tile * BLOCK_N + tl.arange(0, BLOCK_N)
            queries, queries_half_norm, grad_out, values = _token_rows(
                queries_ptr, stride_qn, stride_qd, grad_out_ptr, stride_gn, stride_gd,
                values_ptr, stride_vn, stride_vd, tokens, cols, n_tokens, dims, scale)
            kernel, grad_exponent = _grad_exponent_tile(
                queries, queries_half_norm, grad_out, values, bottleneck,
                bottleneck_half_norm, factor, grad_summary, PRECISION)
            grad_bottleneck += tl.dot(tl.trans(grad_exponent), queries,
                                      input_precision=PRECISION)
            column_sum += tl.sum(grad_exponent, 0)

        grad_bottleneck -= column_sum[:, None] * bottleneck
        partials_ptr += bh * stride_pb + split * stride_ps
        _store_tile(partials_ptr, grad_bottleneck, rows, cols, dims, 1, m, dims)
    else:  # dV and dQ0 on a tile of tokens
        tokens = (program - splits * row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
        queries, queries_half_norm, grad_out, values = _token_rows(
            queries_ptr, stride_qn, stride_qd, grad_out_ptr, stride_gn, stride_gd,
            values_ptr, stride_vn, stride_vd, tokens, cols, n_tokens, dims, scale)
        grad_queries = tl.zeros((BLOCK_N, BLOCK_D), dtype=dtype)
        grad_values = tl.zeros((BLOCK_N, BLOCK_D), dtype=dtype)
        for first in range(0, m, BLOCK_M):
            rows = first + tl.arange(0, BLOCK_M)
            bottleneck, bottleneck_half_norm, factor, grad_summary = _bottleneck_rows(
                bottleneck_ptr, stride_lm, stride_ld, factor_ptr, stride_rm, stride_rd,
                grad_summary_ptr, stride_sm, stride_sd, rows, cols, m, dims)
            kernel, grad_exponent = _grad_exponent_tile(
                queries, queries_half_norm, grad_out, values, bottleneck,
                bottleneck_half_norm, factor, grad_summary, PRECISION)
            grad_values += tl.dot(kernel, grad_summary, input_precision=PRECISION)
            grad_queries += tl.dot(grad_exponent, bottleneck, input_precision=PRECISION)
            grad_queries -= tl.sum(grad_exponent, 1)[:, None] * queries

        grad_queries_ptr += _head_offset(bh, heads, stride_dqb, stride_dqh)
        _store_tile(grad_queries_ptr, _scaled(grad_queries, scale), tokens, cols,
                    stride_dqn, stride_dqd, n_tokens, dims)
        grad_values_ptr += _head_offset(bh, heads, stride_dvb, stride_dvh)
        _store_tile(grad_values_ptr, grad_values, tokens, cols, stride_dvn,
                    stride_dvd, n_tokens, dims)


@triton.jit
def _split_sum_kernel(partials_ptr, stride_pb, stride_ps, splits,
                      out_ptr, stride_ob, stride_oh, stride_om, stride_od,
                      heads, m, dims, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                      SPLIT_BLOCK: tl.constexpr):
    """The sum of the splits' partials on one block of rows: (BLOCK_M, d).

    Grid (m / BLOCK_M, B * h)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    total = _sum_splits(partials_ptr + bh * stride_pb, stride_ps, splits, rows, cols,
                        m, dims, BLOCK_M, BLOCK_D, SPLIT_BLOCK)
    out_ptr += _head_offset(bh, heads, stride_ob, stride_oh)
    _store_tile(out_ptr, total, rows, cols, stride_om, stride_od, m, dims)


# --- Host functions
def _block(size: int, most: int = 1 << 30) -> int:
    """A tile side for ``size``: a power of two, at least 16 (``tl.dot``'s
    least) and at most ``most`` (unless 16 is more)."""
    return max(16, min(triton.next_power_of_2(size), most))


def _splits(tokens: int, block_n: int, programs_per_split: int) -> Tuple[int, int]:
    """``(splits, tiles_per_split)``: the token tiles cut into about
    :data:`TARGET_PROGRAMS` / ``programs_per_split`` splits."""
    tiles = triton.cdiv(tokens, block_n)
    wanted = max(1, min(tiles, TARGET_PROGRAMS // programs_per_split))
    tiles_per_split = triton.cdiv(tiles, wanted)
    return triton.cdiv(tiles, tiles_per_split), tiles_per_split


def _check_inputs(queries: torch.Tensor, bottleneck: torch.Tensor,
                  middle: torch.Tensor, values: torch.Tensor) -> None:
    """Raises a ValueError unless the shapes agree and the dtypes are one of
    float32 and float64 (the kernels accumulate in the inputs' dtype)."""
    if queries.dtype not in (torch.float32, torch.float64):
        raise ValueError(f'queries are {queries.dtype}; these kernels take '
                         f'torch.float32 or torch.float64')
    batch, heads, tokens, dims = queries.shape
    m = bottleneck.shape[-2]
    for name, tensor, shape in (('bottleneck', bottleneck, (batch, heads, m, dims)),
                                ('middle', middle, (batch, heads, m, m)),
                                ('values', values, (batch, heads, tokens, dims))):
        if tuple(tensor.shape) != shape:
            raise ValueError(f'{name} has shape {tuple(tensor.shape)}; queries '
                             f'{tuple(queries.shape)} ask for {shape}')
        if tensor.dtype != queries.dtype:
            raise ValueError(f'{name} is {tensor.dtype}, queries {queries.dtype}')


def _token_sums(queries: torch.Tensor, bottleneck: torch.Tensor, rhs: torch.Tensor,
                scale: float, precision: str) -> torch.Tensor:
    """The partials of ``K1^T X`` over token splits: (B * h, splits, m, d), one
    launch."""
    batch, heads, tokens, dims = queries.shape
    m = bottleneck.shape[-2]
    block_m = _block(m, BOTTLENECK_TILE)
    row_blocks = triton.cdiv(m, block_m)
    splits, tiles_per_split = _splits(tokens, TOKEN_TILE, batch * heads * row_blocks)
    partials = queries.new_empty(batch * heads, splits, m, dims)
    _token_sum_kernel[(splits, row_blocks, batch * heads)](
        queries, *queries.stride(), bottleneck, *bottleneck.stride(),
        rhs, *rhs.stride(), partials, *partials.stride()[:2],
        heads, tokens, m, dims, tiles_per_split, scale,
        BLOCK_N=TOKEN_TILE, BLOCK_M=block_m, BLOCK_D=_block(dims),
        PRECISION=precision, num_warps=NUM_WARPS)
    return partials


def _middle_product(partials: torch.Tensor, middle: torch.Tensor,
                    summary: torch.Tensor, product: torch.Tensor,
                    grad_middle: torch.Tensor, backward: bool, precision: str) -> None:
    """Launches :func:`_middle_kernel`: forward, S and R; backward, dS and
    d middle."""
    batch, heads, m, dims = summary.shape
    block_m = _block(m, BOTTLENECK_TILE)
    middle_strides = middle.stride()
    if backward:  # middle^T
        middle_strides = middle_strides[:2] + middle_strides[:1:-1]
    _middle_kernel[(triton.cdiv(m, block_m), batch * heads)](
        partials, *partials.stride()[:2], partials.shape[1],
        middle, *middle_strides, summary, *summary.stride(),
        product, *product.stride(), grad_middle, *grad_middle.stride(),
        heads, m, dims, BACKWARD=backward, BLOCK_M=block_m,
        BLOCK_D=_block(dims), SPLIT_BLOCK=SPLIT_TILE, PRECISION=precision,
        num_warps=NUM_WARPS)


def products_forward(queries: torch.Tensor, bottleneck: torch.Tensor,
                     middle: torch.Tensor, values: torch.Tensor, scale: float
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``out = K1 . (middle . (K1^T V))``, ``K1 = k(s Q0, L)``, in 3 launches.

    Args:
        queries: Q0 (B, h, N, d), any strides.
        bottleneck: L (B, h, m, d).
        middle: (B, h, m, m).
        values: V (B, h, N, d), any strides.
        scale: s.

    Returns:
        ``(out, summary, factor)``: out (B, h, N, d), a view of a (B, N, h, d)
        contiguous tensor; ``summary = K1^T V`` and ``factor = middle summary``,
        (B, h, m, d) contiguous each.
    """
    _check_inputs(queries, bottleneck, middle, values)
    batch, heads, tokens, dims = queries.shape
    m = bottleneck.shape[-2]
    precision = dot_precision(queries.dtype, float32_accurate=False)
    summary = queries.new_empty(batch, heads, m, dims)
    factor = torch.empty_like(summary)
    out = queries.new_empty(batch, tokens, heads, dims).transpose(1, 2)

    partials = _token_sums(queries, bottleneck, values, scale, precision)
    _middle_product(partials, middle, summary, factor, middle, False, precision)
    block_m = _block(m, BOTTLENECK_TILE)
    _apply_kernel[(triton.cdiv(tokens, TOKEN_TILE), batch * heads)](
        queries, *queries.stride(), bottleneck, *bottleneck.stride(),
        factor, *factor.stride(), out, *out.stride(),
        heads, tokens, m, dims, scale, BLOCK_N=TOKEN_TILE, BLOCK_M=block_m,
        BLOCK_D=_block(dims), PRECISION=precision, num_warps=NUM_WARPS)
    return out, summary, factor


def products_backward(grad_out: torch.Tensor, queries: torch.Tensor,
                      bottleneck: torch.Tensor, middle: torch.Tensor,
                      values: torch.Tensor, summary: torch.Tensor,
                      factor: torch.Tensor, scale: float
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                 torch.Tensor]:
    """The gradients of :func:`products_forward`'s out, in 4 launches.

    With S = summary, R = factor, G = grad_out, E the exponent of K1 = exp(E)
    and Q = s Q0: ``dR = K1^T G``, ``d middle = dR S^T``, ``dS = middle^T dR``,
    ``dV = K1 dS``, ``dE = (G R^T + V dS^T) o K1``,
    ``dQ0 = s (dE L - rowsum(dE) o Q)``, ``dL = dE^T Q - colsum(dE) o L``.

    Args:
        grad_out: G (B, h, N, d), any strides.
        queries, bottleneck, middle, values, scale: as :func:`products_forward`.
        summary, factor: S and R (B, h, m, d), as :func:`products_forward` gave.

    Returns:
        ``(grad_queries, grad_bottleneck, grad_middle, grad_values)``, each
        with its input's shape; grad_queries and grad_values with the inputs'
        strides.
    """
    _check_inputs(queries, bottleneck, middle, values)
    batch, heads, tokens, dims = queries.shape
    m = bottleneck.shape[-2]
    precision = dot_precision(queries.dtype, float32_accurate=False)
    grad_queries = torch.empty_like(queries)
    grad_values = torch.empty_like(values)
    grad_bottleneck = torch.empty_like(bottleneck)
    grad_middle = torch.empty_like(middle)
    grad_summary = torch.empty_like(summary)  # dS

    partials = _token_sums(queries, bottleneck, grad_out, scale, precision)  # of dR
    _middle_product(partials, middle, summary, grad_summary, grad_middle, True,
                    precision)

    block_m = _block(m, BOTTLENECK_TILE)
    row_blocks = triton.cdiv(m, block_m)
    token_tiles = triton.cdiv(tokens, GRADIENT_TOKEN_TILE)
    splits, tiles_per_split = _splits(tokens, GRADIENT_TOKEN_TILE,
                                      batch * heads * row_blocks)
    partials = queries.new_empty(batch * heads, splits, m, dims)  # of dL
    _gradients_kernel[(splits * row_blocks + token_tiles, batch * heads)](
        queries, *queries.stride(), values, *values.stride(),
        grad_out, *grad_out.stride(), bottleneck, *bottleneck.stride(),
        factor, *factor.stride(), grad_summary, *grad_summary.stride(),
        grad_queries, *grad_queries.stride(), grad_values, *grad_values.stride(),
        partials, *partials.stride()[:2],
        heads, tokens, m, dims, splits, row_blocks, tiles_per_split, scale,
        BLOCK_N=GRADIENT_TOKEN_TILE, BLOCK_M=block_m, BLOCK_D=_block(dims),
        PRECISION=precision, num_warps=NUM_WARPS, num_stages=GRADIENT_STAGES)

    _split_sum_kernel[(row_blocks, batch * heads)](
        partials, *partials.stride()[:2], splits,
        grad_bottleneck, *grad_bottleneck.stride(), heads, m, dims,
        BLOCK_M=block_m, BLOCK_D=_block(dims), SPLIT_BLOCK=SPLIT_TILE,
        num_warps=NUM_WARPS)
    return grad_queries, grad_bottleneck, grad_middle, grad_values
