"""SOFT's kernel inverse, forward and backward, one Triton launch each.

One program per (image b, head h) computes, from the bottleneck tokens L
(m, d), the Gaussian kernel ``A_ij = exp(L_i.L_j - |L_i|^2 / 2 - |L_j|^2 / 2)``,
masked to the image's tokens, ``A_m = A o blocks``, ``blocks = inside inside^T``;
the Newton operand P (``A_m + 0.01 I`` for ``'soft'``, ``A_m`` for ``'soft++'``);
the step size alpha from the row sums ``r = A_m 1``; k Newton steps
``V_0 = alpha P``, ``T_j = V_j P``, ``V_{j+1} = 2 V_j - T_j V_j``; and
``middle = V_k o blocks`` (``'soft'``) or ``(s_i V_k[i, j] s_j) o blocks``,
``s = rsqrt(r + 1 - inside)`` (``'soft++'``).

The matrices of one program live in scratch in global memory, padded with
zeros to a whole number of tiles, and every product runs tile by tile; the
threads of a program exchange them through global memory, so each phase that
writes scratch ends with a barrier before the next reads it. The forward
keeps 4 such matrices per program, the backward 2k + 7 (every iterate V_j and
product T_j, as the PyTorch backward keeps them): 12 MB per program at
m = 256, k = 20 in float32. One program for a whole inverse is slow for large
m, but saves the ~160 launches per block that the same math costs in PyTorch:
the callers use these kernels for m <= 256.
"""
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ...utils.validation import check_choice, check_positive_int
from . import dot_precision

VARIANTS = ('soft', 'soft++')
#: The kernels each host function launches (Triton's and torch's).
LAUNCHES = {'inverse_forward': 1, 'inverse_backward': 1}
#: Output tiles of the matrix products are at most this wide, and their K
#: steps this deep (tl.dot's least in Triton 3.6): the FMA products of
#: float32-accurate dots hold a thread's rows and columns of both operands in
#: registers, and float64 takes twice the registers (GPU speed: wider tiles
#: spill).
MAX_TILE = {torch.float32: 64, torch.float64: 32}
K_TILE = 16
#: 8 warps share a 64 x 64 tile: 16 outputs per thread. One program per SM
#: at the grids the models launch (B h <= 32), so registers are not shared.
NUM_WARPS = 8
NUM_STAGES = 3


# --- Tiles in scratch
@triton.jit
def _tile_pointers(ptr, rows, cols, stride, TRANSPOSED: tl.constexpr):
    """Pointers to X[rows, cols], or to X^T[rows, cols] if ``TRANSPOSED``, for X
    row-major with row ``stride``: (R, C)."""
    if TRANSPOSED:
        return ptr + cols[None, :] * stride + rows[:, None]
    return ptr + rows[:, None] * stride + cols[None, :]


@triton.jit
def _load_tile(ptr, rows, cols, padded, TRANSPOSED: tl.constexpr = False):
    """X[rows, cols] (or X^T's) of a padded x padded scratch matrix: (R, C)."""
    return tl.load(_tile_pointers(ptr, rows, cols, padded, TRANSPOSED))


@triton.jit
def _store_tile(ptr, rows, cols, padded, tile):
    """Stores ``tile`` (R, C) at [rows, cols] of a padded x padded scratch matrix."""
    tl.store(_tile_pointers(ptr, rows, cols, padded, False), tile)


@triton.jit
def _tile_product(acc, a_ptr, b_ptr, rows, cols, padded, K_TILE: tl.constexpr,
                  PRECISION: tl.constexpr, TRANS_A: tl.constexpr = False,
                  TRANS_B: tl.constexpr = False):
    """``acc + (op(A) op(B))[rows, cols]``, op a transpose where asked, of padded
    x padded scratch matrices: (R, C), a loop over K in steps of K_TILE. The
    products of a phase accumulate into one tile: fewer registers live."""
    depths = tl.arange(0, K_TILE)
    a_ptrs = _tile_pointers(a_ptr, rows, depths, padded, TRANS_A)
    b_ptrs = _tile_pointers(b_ptr, depths, cols, padded, TRANS_B)
    a_step = K_TILE * padded if TRANS_A else K_TILE  # to the next K step
    b_step = K_TILE if TRANS_B else K_TILE * padded
    for _ in range(0, padded, K_TILE):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc, input_precision=PRECISION,
                     out_dtype=acc.dtype)
        a_ptrs += a_step
        b_ptrs += b_step
    return acc


# --- The Gaussian kernel and the step size
@triton.jit
def _inside(inside_ptr, tokens, stride_im, offsets, dtype: tl.constexpr,
            HAS_MASK: tl.constexpr):
    """1 for the image's own tokens at ``offsets``, 0 for padding: (R, )."""
    if HAS_MASK:
        inside = tl.load(inside_ptr + offsets * stride_im, mask=offsets < tokens,
                         other=0)
        return inside.to(dtype)
    return (offsets < tokens).to(dtype)


@triton.jit
def _load_tokens(l_ptr, rows, features, tokens, dims, stride_lm, stride_ld):
    """L[rows, features], zero past m and d: (R, F)."""
    return tl.load(l_ptr + rows[:, None] * stride_lm + features[None, :] * stride_ld,
                   mask=(rows[:, None] < tokens) & (features[None, :] < dims), other=0)


@triton.jit
def _kernel_tile(l_ptr, inside_ptr, rows, cols, tokens, dims, stride_lm, stride_ld,
                 stride_im, DIMS: tl.constexpr, K_TILE: tl.constexpr,
                 HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """One head's ``A_m = exp(L_i.L_j - |L_i|^2 / 2 - |L_j|^2 / 2) o blocks`` at
    (rows, cols), from its tokens L at ``l_ptr``, K_TILE features at a time: (R, C)."""
    dtype = l_ptr.dtype.element_ty
    exponent = tl.zeros((rows.shape[0], cols.shape[0]), dtype=dtype)
    for f0 in tl.static_range(0, DIMS, K_TILE):
        features = f0 + tl.arange(0, K_TILE)
        left = _load_tokens(l_ptr, rows, features, tokens, dims, stride_lm, stride_ld)
        right = _load_tokens(l_ptr, cols, features, tokens, dims, stride_lm, stride_ld)
        exponent += tl.dot(left, tl.trans(right), input_precision=PRECISION) \
            - 0.5 * tl.sum(left * left, 1)[:, None] \
            - 0.5 * tl.sum(right * right, 1)[None, :]
    blocks = _inside(inside_ptr, tokens, stride_im, rows, dtype, HAS_MASK)[:, None] \
        * _inside(inside_ptr, tokens, stride_im, cols, dtype, HAS_MASK)[None, :]
    return tl.exp(exponent) * blocks


@triton.jit
def _row_sums(l_ptr, inside_ptr, rows_ptr, tokens, dims, padded, stride_lm,
              stride_ld, stride_im, TILE: tl.constexpr, K_TILE: tl.constexpr,
              DIMS: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """Stores one head's row sums ``r = A_m 1`` at ``rows_ptr`` (padded, ) and
    returns their maximum."""
    offsets = tl.arange(0, TILE)
    peak = tl.zeros((TILE, ), dtype=l_ptr.dtype.element_ty)
    for row0 in range(0, padded, TILE):
        sums = tl.zeros((TILE, ), dtype=l_ptr.dtype.element_ty)
        for col0 in range(0, padded, TILE):
            tile = _kernel_tile(l_ptr, inside_ptr, row0 + offsets, col0 + offsets,
                                tokens, dims, stride_lm, stride_ld, stride_im, DIMS,
                                K_TILE, HAS_MASK, PRECISION)
            sums += tl.sum(tile, 1)
        tl.store(rows_ptr + row0 + offsets, sums)
        peak = tl.maximum(peak, sums)
    return tl.max(peak, 0)


@triton.jit
def _halved_step(image_ptr, inside_ptr, rows_ptr, peak, heads, tokens, dims, padded,
                 stride_lh, stride_lm, stride_ld, stride_im, TILE: tl.constexpr,
                 K_TILE: tl.constexpr, DIMS: tl.constexpr, HAS_MASK: tl.constexpr,
                 PRECISION: tl.constexpr):
    """SOFT++'s step size of one image: ``alpha0 = 2 / peak^2`` halved as often
    as the leading steps ``alpha0 / 2^t`` (t < 10) have ``max_{h, j} |1 - step
    S_jj| + step (c_j - S_jj) > 1.01``, ``c = A_m r``, ``S_jj = sum_k A_m[j, k]^2``,
    over all heads, from their row sums r at ``rows_ptr`` (heads, padded)."""
    dtype = image_ptr.dtype.element_ty
    offsets = tl.arange(0, TILE)
    alpha0 = 2 / (peak * peak)
    halvings = tl.arange(0, 16)
    steps = alpha0 / (1 << halvings).to(dtype)  # (16, ): powers of 2, exact
    worst = tl.zeros((16, ), dtype=dtype)  # the largest residual of each step
    for head in range(heads):
        for row0 in range(0, padded, TILE):
            column_sums = tl.zeros((TILE, ), dtype=dtype)  # c
            squares = tl.zeros((TILE, ), dtype=dtype)  # S_jj
            for col0 in range(0, padded, TILE):
                tile = _kernel_tile(image_ptr + head * stride_lh, inside_ptr,
                                    row0 + offsets, col0 + offsets, tokens, dims,
                                    stride_lm, stride_ld, stride_im, DIMS, K_TILE,
                                    HAS_MASK, PRECISION)
                row_sums = tl.load(rows_ptr + head * padded + col0 + offsets)
                column_sums += tl.sum(tile * row_sums[None, :], 1)
                squares += tl.sum(tile * tile, 1)
            residual = tl.abs(1 - steps[:, None] * squares[None, :]) \
                + steps[:, None] * (column_sums - squares)[None, :]  # (16, TILE)
            worst = tl.maximum(worst, tl.max(residual, 1))
    too_large = (worst > 1.01) & (halvings < 10)
    count = tl.min(tl.where(too_large, 16, halvings), 0)  # the leading failures
    return alpha0 / (1 << count).to(dtype)


@triton.jit
def _operand_and_first_iterate(l_ptr, inside_ptr, p_ptr, v_ptr, alpha, tokens, dims,
                               padded, stride_lm, stride_ld, stride_im,
                               TILE: tl.constexpr, K_TILE: tl.constexpr,
                               DIMS: tl.constexpr, SOFT_PLUS: tl.constexpr,
                               HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """Stores P (``A_m + 0.01 I`` or ``A_m``) and ``V_0 = alpha P`` in scratch."""
    offsets = tl.arange(0, TILE)
    for row0 in range(0, padded, TILE):
        rows = row0 + offsets
        for col0 in range(0, padded, TILE):
            cols = col0 + offsets
            tile = _kernel_tile(l_ptr, inside_ptr, rows, cols, tokens, dims, stride_lm,
                                stride_ld, stride_im, DIMS, K_TILE, HAS_MASK, PRECISION)
            if not SOFT_PLUS:
                diagonal = (rows[:, None] == cols[None, :]) & (rows[:, None] < tokens)
                tile = tl.where(diagonal, tile + 0.01, tile)  # 0.01 in L's dtype
            _store_tile(p_ptr, rows, cols, padded, tile)
            _store_tile(v_ptr, rows, cols, padded, alpha * tile)


@triton.jit
def _scale(rows_ptr, offsets, inside):
    """SOFT++'s ``s = rsqrt(r + 1 - inside)`` at ``offsets``: (R, )."""
    return 1 / tl.sqrt(tl.load(rows_ptr + offsets) + 1 - inside)


# --- The Newton iteration and its adjoint
@triton.jit
def _newton_steps(p_ptr, v_ptr, t_ptr, v_slots, t_slots, num_iters, padded,
                  TILE: tl.constexpr, K_TILE: tl.constexpr, PRECISION: tl.constexpr):
    """k steps ``T_j = V_j P``, ``V_{j+1} = 2 V_j - T_j V_j`` from V_0 in scratch:
    V_j at slot ``j % v_slots`` of ``v_ptr``, T_j at ``j % t_slots`` of ``t_ptr``."""
    matrix = padded * padded
    offsets = tl.arange(0, TILE)
    zeros = tl.zeros((TILE, TILE), dtype=p_ptr.dtype.element_ty)
    for step in range(num_iters):
        inverse = v_ptr + (step % v_slots) * matrix  # V_j
        product = t_ptr + (step % t_slots) * matrix  # T_j
        for row0 in range(0, padded, TILE):
            for col0 in range(0, padded, TILE):
                rows, cols = row0 + offsets, col0 + offsets
                tile = _tile_product(zeros, inverse, p_ptr, rows, cols, padded, K_TILE,
                                     PRECISION)
                _store_tile(product, rows, cols, padded, tile)
        tl.debug_barrier()

        following = v_ptr + ((step + 1) % v_slots) * matrix  # V_{j+1}
        for row0 in range(0, padded, TILE):
            for col0 in range(0, padded, TILE):
                rows, cols = row0 + offsets, col0 + offsets
                tile = -2 * _load_tile(inverse, rows, cols, padded)
                tile = _tile_product(tile, product, inverse, rows, cols, padded, K_TILE,
                                     PRECISION)
                _store_tile(following, rows, cols, padded, -tile)
        tl.debug_barrier()


@triton.jit
def _newton_adjoint(p_ptr, v_ptr, t_ptr, g_ptr, dp_ptr, w_ptr, num_iters, padded,
                    TILE: tl.constexpr, K_TILE: tl.constexpr, PRECISION: tl.constexpr):
    """From G = dV_k and dP = 0 at slot 0 of ``g_ptr`` and ``dp_ptr`` (two slots
    each), for j = k - 1 .. 0: ``W = G V_j^T``, ``dP -= V_j^T W``, ``G = 2 G -
    W P^T - T_j^T G``; leaves G and dP at slot ``k % 2``."""
    matrix = padded * padded
    offsets = tl.arange(0, TILE)
    zeros = tl.zeros((TILE, TILE), dtype=p_ptr.dtype.element_ty)
    for step in range(num_iters):
        inverse = v_ptr + (num_iters - 1 - step) * matrix  # V_j
        product = t_ptr + (num_iters - 1 - step) * matrix  # T_j
        grad, grad_next = g_ptr + (step % 2) * matrix, g_ptr + ((step + 1) % 2) * matrix
        dp, dp_next = dp_ptr + (step % 2) * matrix, dp_ptr + ((step + 1) % 2) * matrix
        for row0 in range(0, padded, TILE):
            for col0 in range(0, padded, TILE):
                rows, cols = row0 + offsets, col0 + offsets
                tile = _tile_product(zeros, grad, inverse, rows, cols, padded, K_TILE,
                                     PRECISION, TRANS_B=True)
                _store_tile(w_ptr, rows, cols, padded, tile)
        tl.debug_barrier()

        for row0 in range(0, padded, TILE):
            for col0 in range(0, padded, TILE):
                rows, cols = row0 + offsets, col0 + offsets
                tile = -_load_tile(dp, rows, cols, padded)
                tile = _tile_product(tile, inverse, w_ptr, rows, cols, padded, K_TILE,
                                     PRECISION, TRANS_A=True)
                _store_tile(dp_next, rows, cols, padded, -tile)
                tile = -2 * _load_tile(grad, rows, cols, padded)
                tile = _tile_product(tile, w_ptr, p_ptr, rows, cols, padded, K_TILE,
                                     PRECISION, TRANS_B=True)
                tile = _tile_product(tile, product, grad, rows, cols, padded, K_TILE,
                                     PRECISION, TRANS_A=True)
                _store_tile(grad_next, rows, cols, padded, -tile)
        tl.debug_barrier()


# --- Forward
@triton.jit
def _inverse_forward_kernel(
        bottleneck_ptr, inside_ptr, middle_ptr, alpha_ptr, scratch_ptr, rows_ptr,
        heads, tokens, dims, num_iters,
        stride_lb, stride_lh, stride_lm, stride_ld, stride_ib, stride_im,
        TILE: tl.constexpr, K_TILE: tl.constexpr, DIMS: tl.constexpr,
        SOFT_PLUS: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """``middle`` of one (image, head) program, and the step size it used.

    Scratch: 4 padded x padded matrices (P, V twice, T) and the row sums of
    every head of the image (heads, padded)."""
    program = tl.program_id(0)
    image, head = program // heads, program % heads
    padded = (tl.cdiv(tokens, TILE) * TILE).to(tl.int64)
    matrix = padded * padded
    p_ptr = scratch_ptr + program.to(tl.int64) * 4 * matrix
    v_ptr, t_ptr = p_ptr + matrix, p_ptr + 3 * matrix  # V twice, T
    rows_ptr += program.to(tl.int64) * heads * padded  # r of each head: (heads, padded)
    image_ptr = bottleneck_ptr + image.to(tl.int64) * stride_lb  # L: (h, m, d)
    l_ptr = image_ptr + head * stride_lh
    inside_ptr += image * stride_ib

    # The step size: SOFT's per matrix, SOFT++'s per image, from every head's
    # row sums, computed again by each of the image's programs.
    if SOFT_PLUS:
        peak = _row_sums(image_ptr, inside_ptr, rows_ptr, tokens, dims, padded,
                         stride_lm, stride_ld, stride_im, TILE, K_TILE, DIMS, HAS_MASK,
                         PRECISION)
        for other in range(1, heads):
            peak = tl.maximum(peak, _row_sums(
                image_ptr + other * stride_lh, inside_ptr, rows_ptr + other * padded,
                tokens, dims, padded, stride_lm, stride_ld, stride_im, TILE, K_TILE,
                DIMS, HAS_MASK, PRECISION))
        tl.debug_barrier()
        alpha = _halved_step(image_ptr, inside_ptr, rows_ptr, peak, heads, tokens, dims,
                             padded, stride_lh, stride_lm, stride_ld, stride_im, TILE,
                             K_TILE, DIMS, HAS_MASK, PRECISION)
    else:
        peak = _row_sums(l_ptr, inside_ptr, rows_ptr + head * padded, tokens, dims,
                         padded, stride_lm, stride_ld, stride_im, TILE, K_TILE, DIMS,
                         HAS_MASK, PRECISION)
        alpha = 0.9 * 2 / (peak * peak)
    tl.store(alpha_ptr + program, alpha)

    _operand_and_first_iterate(l_ptr, inside_ptr, p_ptr, v_ptr, alpha, tokens, dims,
                               padded, stride_lm, stride_ld, stride_im, TILE, K_TILE,
                               DIMS, SOFT_PLUS, HAS_MASK, PRECISION)
    tl.debug_barrier()
    _newton_steps(p_ptr, v_ptr, t_ptr, 2, 1, num_iters, padded, TILE, K_TILE,
                  PRECISION)
    inverse = v_ptr + (num_iters % 2) * matrix  # V_k

    # middle = (s_i V_k[i, j] s_j) o blocks, or V_k o blocks.
    dtype = scratch_ptr.dtype.element_ty
    own_rows = rows_ptr + head * padded
    middle_ptr += program.to(tl.int64) * tokens * tokens  # (m, m)
    offsets = tl.arange(0, TILE)
    for row0 in range(0, padded, TILE):
        rows = row0 + offsets
        inside_rows = _inside(inside_ptr, tokens, stride_im, rows, dtype, HAS_MASK)
        for col0 in range(0, padded, TILE):
            cols = col0 + offsets
            inside_cols = _inside(inside_ptr, tokens, stride_im, cols, dtype, HAS_MASK)
            tile = _load_tile(inverse, rows, cols, padded) \
                * inside_rows[:, None] * inside_cols[None, :]
            if SOFT_PLUS:
                tile *= _scale(own_rows, rows, inside_rows)[:, None] \
                    * _scale(own_rows, cols, inside_cols)[None, :]
            tl.store(middle_ptr + rows[:, None] * tokens + cols[None, :], tile,
                     mask=(rows[:, None] < tokens) & (cols[None, :] < tokens))


# --- Backward
@triton.jit
def _load_output_gradient(grad_ptr, rows, cols, tokens, stride_gi, stride_gj,
                          inside_rows, inside_cols):
    """``dMb = dM o blocks`` at (rows, cols), zero past m: (R, C)."""
    grad = tl.load(grad_ptr + rows[:, None] * stride_gi + cols[None, :] * stride_gj,
                   mask=(rows[:, None] < tokens) & (cols[None, :] < tokens), other=0)
    return grad * inside_rows[:, None] * inside_cols[None, :]


@triton.jit
def _inverse_backward_kernel(
        grad_middle_ptr, bottleneck_ptr, inside_ptr, alpha_ptr, grad_ptr, scratch_ptr,
        vectors_ptr, heads, tokens, dims, num_iters,
        stride_mb, stride_mh, stride_mi, stride_mj,
        stride_lb, stride_lh, stride_lm, stride_ld,
        stride_gb, stride_gh, stride_gm, stride_gd,
        stride_ib, stride_im, stride_ab, stride_ah,
        TILE: tl.constexpr, K_TILE: tl.constexpr, DIMS: tl.constexpr,
        SOFT_PLUS: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
    """``dL`` of one (image, head) program from ``dM``, alpha a constant.

    Recomputes A, P and the iterates (V_0 .. V_k and T_0 .. T_{k-1} kept in
    scratch), then with ``dMb = dM o blocks``:

    - SOFT++: ``dV_k = s_i dMb[i, j] s_j``, ``ds_i = sum_j dMb[i, j] V_k[i, j]
      s_j + sum_j dMb[j, i] V_k[j, i] s_j``, ``dr_i = -s_i^3 ds_i / 2``; SOFT:
      ``dV_k = dMb``, ``dr = 0``;
    - the Newton adjoint, G = dV_k, dP = 0, for j = k - 1 .. 0: ``W = G V_j^T``,
      ``dP -= V_j^T W``, ``G = 2 G - W P^T - T_j^T G``; then ``dP += alpha G``;
    - ``dA = (dP + dr 1^T) o blocks``, ``dE = dA o A``,
      ``dL_i = sum_j (dE_ij + dE_ji) (L_j - L_i)``.

    Scratch: 2k + 7 padded x padded matrices and 2 vectors (r, dr)."""
    program = tl.program_id(0)
    image, head = program // heads, program % heads
    padded = (tl.cdiv(tokens, TILE) * TILE).to(tl.int64)
    matrix = padded * padded
    p_ptr = scratch_ptr + program.to(tl.int64) * (2 * num_iters + 7) * matrix
    v_ptr = p_ptr + matrix  # V_0 .. V_k
    t_ptr = v_ptr + (num_iters + 1) * matrix  # T_0 .. T_{k-1}
    g_ptr = t_ptr + num_iters * matrix  # G, twice
    dp_ptr = g_ptr + 2 * matrix  # dP, twice
    w_ptr = dp_ptr + 2 * matrix
    rows_ptr = vectors_ptr + program.to(tl.int64) * 2 * padded  # r
    row_grad_ptr = rows_ptr + padded  # dr
    l_ptr = bottleneck_ptr + image.to(tl.int64) * stride_lb + head * stride_lh
    grad_ptr += image.to(tl.int64) * stride_gb + head * stride_gh
    grad_middle_ptr += image.to(tl.int64) * stride_mb + head * stride_mh
    inside_ptr += image * stride_ib
    alpha = tl.load(alpha_ptr + image * stride_ab + head * stride_ah)
    dtype = scratch_ptr.dtype.element_ty
    offsets = tl.arange(0, TILE)

    # The forward again, keeping every iterate.
    if SOFT_PLUS:
        _row_sums(l_ptr, inside_ptr, rows_ptr, tokens, dims, padded, stride_lm,
                  stride_ld, stride_im, TILE, K_TILE, DIMS, HAS_MASK, PRECISION)
    _operand_and_first_iterate(l_ptr, inside_ptr, p_ptr, v_ptr, alpha, tokens, dims,
                               padded, stride_lm, stride_ld, stride_im, TILE, K_TILE,
                               DIMS, SOFT_PLUS, HAS_MASK, PRECISION)
    tl.debug_barrier()
    _newton_steps(p_ptr, v_ptr, t_ptr, num_iters + 1, num_iters, num_iters, padded,
                  TILE, K_TILE, PRECISION)
    inverse = v_ptr + num_iters * matrix  # V_k

    # G = dV_k and dr from dM; dP = 0.
    for row0 in range(0, padded, TILE):
        rows = row0 + offsets
        inside_rows = _inside(inside_ptr, tokens, stride_im, rows, dtype, HAS_MASK)
        if SOFT_PLUS:
            scale_rows = _scale(rows_ptr, rows, inside_rows)
            scale_grad = tl.zeros((TILE, ), dtype=dtype)  # ds
        for col0 in range(0, padded, TILE):
            cols = col0 + offsets
            inside_cols = _inside(inside_ptr, tokens, stride_im, cols, dtype, HAS_MASK)
            tile = _load_output_gradient(grad_middle_ptr, rows, cols, tokens, stride_mi,
                                         stride_mj, inside_rows, inside_cols)
            if SOFT_PLUS:
                tile_t = _load_output_gradient(grad_middle_ptr, rows, cols, tokens,
                                               stride_mj, stride_mi, inside_rows,
                                               inside_cols)  # dMb^T
                scale_cols = _scale(rows_ptr, cols, inside_cols)
                weighted = tile * _load_tile(inverse, rows, cols, padded) \
                    + tile_t * _load_tile(inverse, rows, cols, padded, True)
                scale_grad += tl.sum(weighted * scale_cols[None, :], 1)
                tile *= scale_rows[:, None] * scale_cols[None, :]
            _store_tile(g_ptr, rows, cols, padded, tile)
            _store_tile(dp_ptr, rows, cols, padded, tl.zeros_like(tile))
        if SOFT_PLUS:
            tl.store(row_grad_ptr + rows,
                     -0.5 * scale_rows * scale_rows * scale_rows * scale_grad)
    tl.debug_barrier()

    _newton_adjoint(p_ptr, v_ptr, t_ptr, g_ptr, dp_ptr, w_ptr, num_iters, padded, TILE,
                    K_TILE, PRECISION)
    grad_inverse = g_ptr + (num_iters % 2) * matrix  # G_0
    grad_operand = dp_ptr + (num_iters % 2) * matrix  # dP before alpha G_0

    # dL_i = sum_j F_ij L_j - L_i sum_j F_ij, F = dE + dE^T, K_TILE columns
    # j at a time (the K of the product).
    features = tl.arange(0, DIMS)
    for row0 in range(0, padded, TILE):
        rows = row0 + offsets
        acc = tl.zeros((TILE, DIMS), dtype=dtype)
        weights = tl.zeros((TILE, ), dtype=dtype)
        for col0 in range(0, padded, K_TILE):
            cols = col0 + tl.arange(0, K_TILE)
            grad_a = _load_tile(grad_operand, rows, cols, padded) \
                + _load_tile(grad_operand, rows, cols, padded, True) \
                + alpha * (_load_tile(grad_inverse, rows, cols, padded)
                           + _load_tile(grad_inverse, rows, cols, padded, True))
            if SOFT_PLUS:
                grad_a += tl.load(row_grad_ptr + rows)[:, None] \
                    + tl.load(row_grad_ptr + cols)[None, :]
            tile = grad_a * _kernel_tile(l_ptr, inside_ptr, rows, cols, tokens, dims,
                                         stride_lm, stride_ld, stride_im, DIMS, K_TILE,
                                         HAS_MASK, PRECISION)  # F
            right = _load_tokens(l_ptr, cols, features, tokens, dims, stride_lm,
                                 stride_ld)
            acc = tl.dot(tile, right, acc, input_precision=PRECISION, out_dtype=dtype)
            weights += tl.sum(tile, 1)
        left = _load_tokens(l_ptr, rows, features, tokens, dims, stride_lm, stride_ld)
        tl.store(grad_ptr + rows[:, None] * stride_gm + features[None, :] * stride_gd,
                 acc - weights[:, None] * left,
                 mask=(rows[:, None] < tokens) & (features[None, :] < dims))


# --- Host functions
def tile_size(tokens: int, dtype: torch.dtype) -> int:
    """The side of the product tiles for m tokens: a power of 2, at least 16
    and at most :data:`MAX_TILE`."""
    return min(MAX_TILE[dtype], max(16, triton.next_power_of_2(tokens)))


def padded_size(tokens: int, dtype: torch.dtype) -> int:
    """m rounded up to a whole number of tiles: the side of a scratch matrix."""
    tile = tile_size(tokens, dtype)
    return math.ceil(tokens / tile) * tile


def _check_inputs(bottleneck: torch.Tensor, inside: Optional[torch.Tensor],
                  variant: str, num_iters: int) -> None:
    """Raises ValueError unless the host functions can take these arguments."""
    check_choice('variant', variant, VARIANTS)
    check_positive_int('num_iters', num_iters)
    if bottleneck.dim() != 4 or bottleneck.dtype not in MAX_TILE:
        raise ValueError(f'bottleneck must be a float32 or float64 (B, h, m, d) '
                         f'tensor; got {bottleneck.dtype} of shape '
                         f'{tuple(bottleneck.shape)}.')
    images, tokens = bottleneck.shape[0], bottleneck.shape[2]
    if inside is not None and tuple(inside.shape) != (images, tokens):
        raise ValueError(f'inside must have shape (B, m) = {(images, tokens)}; got '
                         f'{tuple(inside.shape)}.')


def kernel_constexprs(bottleneck: torch.Tensor, inside: Optional[torch.Tensor],
                      variant: str) -> dict:
    """The constants both kernels are compiled for, from the host functions'
    arguments (shapes and dtypes alone: meta tensors do)."""
    tokens, dims = bottleneck.shape[2:]
    return dict(TILE=tile_size(tokens, bottleneck.dtype), K_TILE=K_TILE,
                DIMS=max(K_TILE, triton.next_power_of_2(dims)),
                SOFT_PLUS=variant == 'soft++', HAS_MASK=inside is not None,
                PRECISION=dot_precision(bottleneck.dtype, True))


def _mask_strides(inside: Optional[torch.Tensor]) -> Tuple[int, int]:
    """``inside``'s strides (B, m); zeros without a mask."""
    return (0, 0) if inside is None else tuple(inside.stride())


def inverse_forward(bottleneck: torch.Tensor, inside: Optional[torch.Tensor],
                    variant: str, num_iters: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """SOFT's ``middle`` of the bottleneck tokens, in one launch.

    Args:
        bottleneck: L, float32 or float64 (B, h, m, d), any strides.
        inside: 1 for each image's own tokens (first), 0 for padding (B, m),
            or None where every token is the image's.
        variant: ``'soft'`` (``(A + 0.01 I)^-1``) or ``'soft++'`` (``D^-1/2
            pinv(A) D^-1/2``). Where m or an image's token count is below 3,
            the reference runs ``'soft'`` instead
            (:func:`mmsoft.ops.kernel_inverse.inverse_formula`): the caller's to pass.
        num_iters: k >= 1 Newton steps.

    Returns:
        ``middle`` (B, h, m, m), contiguous, and the step size alpha (B, h)
        that backward takes.
    """
    _check_inputs(bottleneck, inside, variant, num_iters)
    images, heads, tokens, dims = bottleneck.shape
    padded = padded_size(tokens, bottleneck.dtype)
    scratch = torch.empty(images * heads, 4, padded, padded, dtype=bottleneck.dtype,
                          device=bottleneck.device)  # P, V twice, T
    rows = torch.empty(images * heads, heads, padded, dtype=bottleneck.dtype,
                       device=bottleneck.device)  # r of every head of the image
    middle = torch.empty(images, heads, tokens, tokens, dtype=bottleneck.dtype,
                         device=bottleneck.device)
    alpha = torch.empty(images, heads, dtype=bottleneck.dtype, device=bottleneck.device)
    mask = bottleneck if inside is None else inside  # never read without a mask
    _inverse_forward_kernel[(images * heads, )](
        bottleneck, mask, middle, alpha, scratch, rows, heads, tokens, dims, num_iters,
        *bottleneck.stride(), *_mask_strides(inside),
        **kernel_constexprs(bottleneck, inside, variant), num_warps=NUM_WARPS,
        num_stages=NUM_STAGES)
    return middle, alpha


def inverse_backward(grad_middle: torch.Tensor, bottleneck: torch.Tensor,
                     inside: Optional[torch.Tensor], alpha: torch.Tensor, variant: str,
                     num_iters: int) -> torch.Tensor:
    """The gradient of :func:`inverse_forward`'s ``middle`` with respect to L,
    alpha held constant, in one launch.

    Args:
        grad_middle: dM (B, h, m, m), any strides.
        bottleneck, inside, variant, num_iters: as given to
            :func:`inverse_forward`.
        alpha: the step size :func:`inverse_forward` returned (B, h).

    Returns:
        dL (B, h, m, d), with the strides of ``bottleneck``.
    """
    _check_inputs(bottleneck, inside, variant, num_iters)
    images, heads, tokens, dims = bottleneck.shape
    padded = padded_size(tokens, bottleneck.dtype)
    # P, V_0 .. V_k, T_0 .. T_{k-1}, G and dP twice (read and written in turns), W
    scratch = torch.empty(images * heads, 2 * num_iters + 7, padded, padded,
                          dtype=bottleneck.dtype, device=bottleneck.device)
    vectors = torch.empty(images * heads, 2, padded, dtype=bottleneck.dtype,
                          device=bottleneck.device)  # r, dr
    grad = torch.empty_like(bottleneck)
    mask = bottleneck if inside is None else inside  # never read without a mask
    _inverse_backward_kernel[(images * heads, )](
        grad_middle, bottleneck, mask, alpha, grad, scratch, vectors, heads, tokens,
        dims, num_iters, *grad_middle.stride(), *bottleneck.stride(), *grad.stride(),
        *_mask_strides(inside), *alpha.stride(),
        **kernel_constexprs(bottleneck, inside, variant), num_warps=NUM_WARPS,
        num_stages=NUM_STAGES)
    return grad
