"""UFO-ViT's XNorm attention, ``XNorm(Q) . XNorm(K^T V)``, as Triton kernels.

Per image b and head h, with Q, K, V (N, d) the head's slices of the qkv
projection, K zero at the padding tokens and ``g = gamma_q[h] gamma_kv[h]``:

    S = K^T V                                       # the context, (d, d)
    S^[:, c] = g S[:, c] / max(|S[:, c]|, eps)      # its columns normalised
    out_n = q_n . S^ / max(|q_n|, eps)              # (N, d)

The forward sums K^T V over splits of the tokens, adds the splits' partial
sums, and multiplies each block of tokens by S^: three launches. The backward
(:func:`xnorm_backward` gives its formulas) takes three: Q's gradient with the
partial sums of ``Q^^T G``, the context's gradient, then K's and V's gradients
with the gammas' gradients summed over the batch. Partial sums are added in a
fixed order, without atomics, so that results are deterministic.
"""
from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from . import dot_precision

#: The kernels each host function launches.
LAUNCHES = {'xnorm_forward': 3, 'xnorm_backward': 3}

#: Programs that a pass over the tokens aims at, about four per SM of an H100
#: (132 SMs): the tokens of an (image, head) are split so that small batches
#: keep the GPU busy. The partial sums take at most max(B h, 512) d x d blocks.
TARGET_PROGRAMS = 512
#: Tokens per tile: 64 x 64 tiles for tl.dot in float32; float64 halves the
#: tile, so that its shared memory (and the programs an SM holds) is that of
#: float32.
BLOCK_TOKENS = {torch.float32: 64, torch.float64: 32}
BLOCK_IMAGES = 32  # images per step of the gammas' sum over the batch
#: Float32 dots of 'ieee' precision run on the FMA units: 8 warps halve each
#: thread's share (registers and code) of a 64 x 64 x 64 product.
NUM_WARPS = 8
NUM_STAGES = 2  # two stages of loads in flight in the loops over token tiles

# The chunks of qkv's last dimension.
Q, K, V = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


# --- Helpers
@triton.jit
def _tile(ptr, rows, cols, stride_row, stride_col, num_rows, num_cols):
    """Pointers to the (rows, cols) elements of a matrix, and where they exist."""
    pointers = ptr + rows[:, None] * stride_row + cols[None, :] * stride_col
    inside = (rows[:, None] < num_rows) & (cols[None, :] < num_cols)
    return pointers, inside


@triton.jit
def _load_tile(ptr, rows, cols, stride_row, stride_col, num_rows, num_cols):
    """The (rows, cols) elements of a matrix, zero outside it."""
    pointers, inside = _tile(ptr, rows, cols, stride_row, stride_col, num_rows,
                             num_cols)
    return tl.load(pointers, mask=inside, other=0.)


@triton.jit
def _store_tile(ptr, rows, cols, stride_row, stride_col, num_rows, num_cols, value):
    """Stores ``value`` to the (rows, cols) elements of a matrix that exist."""
    pointers, inside = _tile(ptr, rows, cols, stride_row, stride_col, num_rows,
                             num_cols)
    tl.store(pointers, value.to(ptr.dtype.element_ty), mask=inside)


@triton.jit
def _head(ptr, image, head, chunk, num_heads, head_dim, stride_b, stride_c):
    """The pointer to the first element of one head of one image in a (B, N,
    chunks * C) tensor: chunk 0-2 of qkv (Q, K, V), chunk 0 of out."""
    column = (chunk * num_heads + head) * head_dim
    return ptr + image.to(tl.int64) * stride_b + column * stride_c


@triton.jit
def _gamma(gamma_q_ptr, gamma_kv_ptr, head, dtype: tl.constexpr):
    """``g = gamma_q[head] gamma_kv[head]``, multiplied in the gammas' dtype."""
    return (tl.load(gamma_q_ptr + head) * tl.load(gamma_kv_ptr + head)).to(dtype)


@triton.jit
def _unit_vectors(matrix, AXIS: tl.constexpr, EPS: tl.constexpr):
    """``matrix / max(|matrix|, eps)`` with the norms taken along ``AXIS``; also
    the clamped norms, and where a norm is at least eps (the clamp passes its
    gradient there)."""
    norms = tl.sqrt(tl.sum(matrix * matrix, axis=AXIS))
    # A full tensor holds eps in the matrix's dtype (a bare float would be
    # rounded to float32 first).
    clamped = tl.maximum(norms, tl.full(norms.shape, EPS, norms.dtype))
    units = matrix / tl.expand_dims(clamped, AXIS)
    return units, clamped, norms >= clamped


@triton.jit
def _load_square(ptr, index, dims, head_dim):
    """Matrix ``index`` (D, D) of a stack of d x d matrices, zero-padded."""
    return _load_tile(ptr + index * head_dim * head_dim, dims, dims, head_dim, 1,
                      head_dim, head_dim)


@triton.jit
def _store_square(ptr, index, dims, head_dim, value):
    """Stores ``value`` (D, D) to matrix ``index`` of a stack of d x d matrices."""
    _store_tile(ptr + index * head_dim * head_dim, dims, dims, head_dim, 1, head_dim,
                head_dim, value)


@triton.jit
def _normalized_context(context_ptr, image_head, dims, head_dim, EPS: tl.constexpr):
    """The columns of one context S (d, d) as unit vectors ``u_c = S[:, c] /
    max(n_c, eps)``, with their clamped norms and where ``n_c >= eps``."""
    context = _load_square(context_ptr, image_head, dims, head_dim)
    return _unit_vectors(context, 0, EPS)  # (D, D), (D, ), (D, )


@triton.jit
def _context_hat(context_ptr, gamma_q_ptr, gamma_kv_ptr, image_head, head, dims,
                 head_dim, dtype: tl.constexpr, EPS: tl.constexpr):
    """``S^ = g U`` (D, D) of one image and head."""
    units, _, _ = _normalized_context(context_ptr, image_head, dims, head_dim, EPS)
    return _gamma(gamma_q_ptr, gamma_kv_ptr, head, dtype) * units


@triton.jit
def _key_rows(key_mask_ptr, image, tokens, num_tokens, stride_mask_b, stride_mask_n,
              HAS_KEY_MASK: tl.constexpr):
    """Where the tokens (BLOCK_N, ) are keys: inside the image, and True in the
    key mask."""
    is_key = tokens < num_tokens
    if HAS_KEY_MASK:
        mask_ptr = key_mask_ptr + image.to(tl.int64) * stride_mask_b
        flags = tl.load(mask_ptr + tokens * stride_mask_n, mask=is_key, other=0)
        # The one-element sum hides the mask's 1-bit load from the choice of the
        # dot operands' layout: Triton 3.8 takes the narrowest load that an
        # operand depends on, and then fails to compile float64 dots for sm_80.
        flags = tl.sum(flags[:, None].to(tl.int32), axis=1)
        is_key = is_key & (flags != 0)
    return is_key


@triton.jit
def _keys_values_tile(qkv_ptr, key_mask_ptr, image, head, tokens, dims, num_tokens,
                      num_heads, head_dim, stride_b, stride_n, stride_c,
                      stride_mask_b, stride_mask_n, HAS_KEY_MASK: tl.constexpr):
    """One tile of keys, zero at the padding tokens, and of values (BLOCK_N, D)
    each; also the rows that are keys."""
    is_key = _key_rows(key_mask_ptr, image, tokens, num_tokens, stride_mask_b,
                       stride_mask_n, HAS_KEY_MASK)
    keys_ptr = _head(qkv_ptr, image, head, K, num_heads, head_dim, stride_b, stride_c)
    pointers, inside = _tile(keys_ptr, tokens, dims, stride_n, stride_c, num_tokens,
                             head_dim)
    keys = tl.load(pointers, mask=inside & is_key[:, None], other=0.)
    values_ptr = _head(qkv_ptr, image, head, V, num_heads, head_dim, stride_b,
                       stride_c)
    values = _load_tile(values_ptr, tokens, dims, stride_n, stride_c, num_tokens,
                        head_dim)
    return keys, values, is_key


@triton.jit
def _sum_partials(partials_ptr, image_head, num_splits, dims, head_dim):
    """The sum of one (image, head)'s partial sums (S, d, d), in split order."""
    first = image_head * num_splits
    total = _load_square(partials_ptr, first, dims, head_dim)
    for split in range(1, num_splits):
        total += _load_square(partials_ptr, first + split, dims, head_dim)
    return total  # (D, D)


@triton.jit
def _split_range(split, tokens_per_split, num_tokens):
    """The first token of a split, and the end of its tokens."""
    start = split * tokens_per_split
    return start, tl.minimum(start + tokens_per_split, num_tokens)


# --- Forward
@triton.jit
def _context_partials_kernel(
        qkv_ptr, key_mask_ptr, partials_ptr,  # (B, N, 3C), (B, N), (B h, S, d, d)
        num_tokens, num_heads, head_dim, tokens_per_split,
        stride_b, stride_n, stride_c, stride_mask_b, stride_mask_n,
        HAS_KEY_MASK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr):
    """Sums K^T V over the tokens of one split of one image and head."""
    split, image_head = tl.program_id(0), tl.program_id(1)
    image, head = image_head // num_heads, image_head % num_heads
    dims = tl.arange(0, BLOCK_D)

    context = tl.zeros((BLOCK_D, BLOCK_D), qkv_ptr.dtype.element_ty)
    start, end = _split_range(split, tokens_per_split, num_tokens)
    for first in range(start, end, BLOCK_N):
        tokens = first + tl.arange(0, BLOCK_N)
        keys, values, _ = _keys_values_tile(  # (BLOCK_N, D) each
            qkv_ptr, key_mask_ptr, image, head, tokens, dims, end, num_heads, head_dim,
            stride_b, stride_n, stride_c, stride_mask_b, stride_mask_n, HAS_KEY_MASK)
        context = tl.dot(tl.trans(keys), values, context, input_precision=PRECISION)

    _store_square(partials_ptr, image_head * tl.num_programs(0) + split, dims,
                  head_dim, context)


@triton.jit
def _context_sum_kernel(
        partials_ptr, context_ptr,  # (B h, S, d, d), (B h, d, d)
        num_splits, head_dim, BLOCK_D: tl.constexpr):
    """Adds the splits' partial sums of K^T V of one image and head."""
    image_head = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    context = _sum_partials(partials_ptr, image_head, num_splits, dims, head_dim)
    _store_square(context_ptr, image_head, dims, head_dim, context)


@triton.jit
def _output_kernel(
        qkv_ptr, context_ptr, gamma_q_ptr, gamma_kv_ptr, out_ptr,
        num_tokens, num_heads, head_dim, tokens_per_split,
        stride_b, stride_n, stride_c, stride_out_b, stride_out_n, stride_out_c,
        EPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr):
    """``out = Q^ . S^`` on the tokens of one split of one image and head."""
    split, image_head = tl.program_id(0), tl.program_id(1)
    image, head = image_head // num_heads, image_head % num_heads
    dims = tl.arange(0, BLOCK_D)
    context_hat = _context_hat(context_ptr, gamma_q_ptr, gamma_kv_ptr, image_head,
                               head, dims, head_dim, qkv_ptr.dtype.element_ty, EPS)

    queries_ptr = _head(qkv_ptr, image, head, Q, num_heads, head_dim, stride_b,
                        stride_c)
    out_head_ptr = _head(out_ptr, image, head, 0, num_heads, head_dim, stride_out_b,
                         stride_out_c)
    start, end = _split_range(split, tokens_per_split, num_tokens)
    for first in range(start, end, BLOCK_N):
        tokens = first + tl.arange(0, BLOCK_N)
        queries = _load_tile(queries_ptr, tokens, dims, stride_n, stride_c, end,
                             head_dim)  # (BLOCK_N, D)
        normalized, _, _ = _unit_vectors(queries, 1, EPS)
        out = tl.dot(normalized, context_hat, input_precision=PRECISION)
        _store_tile(out_head_ptr, tokens, dims, stride_out_n, stride_out_c, end,
                    head_dim, out)


# --- Backward
@triton.jit
def _query_grad_kernel(
        grad_out_ptr, qkv_ptr, context_ptr, gamma_q_ptr, gamma_kv_ptr,
        grad_qkv_ptr, partials_ptr,  # (B, N, C), (B, N, 3C), ..., (B h, S, d, d)
        num_tokens, num_heads, head_dim, tokens_per_split,
        stride_grad_b, stride_grad_n, stride_grad_c, stride_b, stride_n, stride_c,
        stride_dqkv_b, stride_dqkv_n, stride_dqkv_c,
        EPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr):
    """Q's gradient on the tokens of one split of one image and head, and the
    split's partial sum of ``d S^ = Q^^T G``."""
    split, image_head = tl.program_id(0), tl.program_id(1)
    image, head = image_head // num_heads, image_head % num_heads
    dtype = qkv_ptr.dtype.element_ty
    dims = tl.arange(0, BLOCK_D)
    context_hat = _context_hat(context_ptr, gamma_q_ptr, gamma_kv_ptr, image_head,
                               head, dims, head_dim, dtype, EPS)  # (D, D)
    context_hat_t = tl.trans(context_hat)

    grad_ptr = _head(grad_out_ptr, image, head, 0, num_heads, head_dim,
                     stride_grad_b, stride_grad_c)
    queries_ptr = _head(qkv_ptr, image, head, Q, num_heads, head_dim, stride_b,
                        stride_c)
    grad_queries_ptr = _head(grad_qkv_ptr, image, head, Q, num_heads, head_dim,
                             stride_dqkv_b, stride_dqkv_c)
    grad_context_hat = tl.zeros((BLOCK_D, BLOCK_D), dtype)
    start, end = _split_range(split, tokens_per_split, num_tokens)
    for first in range(start, end, BLOCK_N):
        tokens = first + tl.arange(0, BLOCK_N)
        grad = _load_tile(grad_ptr, tokens, dims, stride_grad_n, stride_grad_c, end,
                          head_dim).to(dtype)  # G: (BLOCK_N, D)
        queries = _load_tile(queries_ptr, tokens, dims, stride_n, stride_c, end,
                             head_dim)
        normalized, norms, unclamped = _unit_vectors(queries, 1, EPS)

        projected = tl.dot(grad, context_hat_t, input_precision=PRECISION)
        along = tl.where(unclamped, tl.sum(normalized * projected, axis=1), 0.)
        grad_queries = (projected - along[:, None] * normalized) / norms[:, None]
        _store_tile(grad_queries_ptr, tokens, dims, stride_dqkv_n, stride_dqkv_c, end,
                    head_dim, grad_queries)

        grad_context_hat = tl.dot(tl.trans(normalized), grad, grad_context_hat,
                                  input_precision=PRECISION)

    _store_square(partials_ptr, image_head * tl.num_programs(0) + split, dims,
                  head_dim, grad_context_hat)


@triton.jit
def _context_grad_kernel(
        partials_ptr, context_ptr, gamma_q_ptr, gamma_kv_ptr,
        grad_context_ptr, grad_gamma_ptr,  # (B h, S, d, d), ..., (B h, d, d), (B h, )
        num_splits, num_heads, head_dim,
        EPS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The gradient of one context S = K^T V and of its head's g, for one image."""
    image_head = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    grad_context_hat = _sum_partials(partials_ptr, image_head, num_splits, dims,
                                     head_dim)  # (D, D)
    units, norms, unclamped = _normalized_context(context_ptr, image_head, dims,
                                                  head_dim, EPS)
    tl.store(grad_gamma_ptr + image_head,
             tl.sum(tl.sum(grad_context_hat * units, axis=1), axis=0))

    gamma = _gamma(gamma_q_ptr, gamma_kv_ptr, image_head % num_heads, units.dtype)
    grad_units = gamma * grad_context_hat
    along = tl.where(unclamped, tl.sum(units * grad_units, axis=0), 0.)  # (D, )
    grad_context = (grad_units - units * along[None, :]) / norms[None, :]
    _store_square(grad_context_ptr, image_head, dims, head_dim, grad_context)


@triton.jit
def _store_gamma_grads(grad_gamma_ptr, gamma_q_ptr, gamma_kv_ptr, grad_gamma_q_ptr,
                       grad_gamma_kv_ptr, head, batch, num_heads,
                       BLOCK_B: tl.constexpr):
    """Sums one head's gradient of g over the images, in their order, and stores
    the gradients of gamma_q and gamma_kv."""
    images = tl.arange(0, BLOCK_B)
    total = tl.zeros((BLOCK_B, ), grad_gamma_ptr.dtype.element_ty)
    for first in range(0, batch, BLOCK_B):
        total += tl.load(grad_gamma_ptr + (first + images) * num_heads + head,
                         mask=first + images < batch, other=0.)
    grad_gamma = tl.sum(total, axis=0).to(grad_gamma_q_ptr.dtype.element_ty)
    tl.store(grad_gamma_q_ptr + head, grad_gamma * tl.load(gamma_kv_ptr + head))
    tl.store(grad_gamma_kv_ptr + head, grad_gamma * tl.load(gamma_q_ptr + head))


@triton.jit
def _key_value_grad_kernel(
        qkv_ptr, key_mask_ptr, grad_context_ptr, grad_gamma_ptr,
        gamma_q_ptr, gamma_kv_ptr, grad_qkv_ptr, grad_gamma_q_ptr, grad_gamma_kv_ptr,
        batch, num_tokens, num_heads, head_dim, tokens_per_split,
        stride_b, stride_n, stride_c, stride_mask_b, stride_mask_n,
        stride_dqkv_b, stride_dqkv_n, stride_dqkv_c,
        HAS_KEY_MASK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_B: tl.constexpr, PRECISION: tl.constexpr):
    """K's and V's gradients on the tokens of one split of one image and head;
    the first split of the first image also stores its head's gammas' gradients."""
    split, image_head = tl.program_id(0), tl.program_id(1)
    image, head = image_head // num_heads, image_head % num_heads
    dims = tl.arange(0, BLOCK_D)
    grad_context = _load_square(grad_context_ptr, image_head, dims, head_dim)
    grad_context_t = tl.trans(grad_context)  # (D, D) each

    grad_keys_ptr = _head(grad_qkv_ptr, image, head, K, num_heads, head_dim,
                          stride_dqkv_b, stride_dqkv_c)
    grad_values_ptr = _head(grad_qkv_ptr, image, head, V, num_heads, head_dim,
                            stride_dqkv_b, stride_dqkv_c)
    start, end = _split_range(split, tokens_per_split, num_tokens)
    for first in range(start, end, BLOCK_N):
        tokens = first + tl.arange(0, BLOCK_N)
        keys, values, is_key = _keys_values_tile(  # (BLOCK_N, D) each
            qkv_ptr, key_mask_ptr, image, head, tokens, dims, end, num_heads, head_dim,
            stride_b, stride_n, stride_c, stride_mask_b, stride_mask_n, HAS_KEY_MASK)

        grad_keys = tl.dot(values, grad_context_t, input_precision=PRECISION)
        _store_tile(grad_keys_ptr, tokens, dims, stride_dqkv_n, stride_dqkv_c, end,
                    head_dim, tl.where(is_key[:, None], grad_keys, 0.))
        grad_values = tl.dot(keys, grad_context, input_precision=PRECISION)
        _store_tile(grad_values_ptr, tokens, dims, stride_dqkv_n, stride_dqkv_c, end,
                    head_dim, grad_values)

    if (split == 0) & (image == 0):
        _store_gamma_grads(grad_gamma_ptr, gamma_q_ptr, gamma_kv_ptr, grad_gamma_q_ptr,
                           grad_gamma_kv_ptr, head, batch, num_heads, BLOCK_B)


# --- Host functions
def _check_inputs(qkv: torch.Tensor, num_heads: int,
                  key_mask: Optional[torch.Tensor]) -> None:
    """Raises ``ValueError`` unless the kernels can take these inputs."""
    if qkv.dim() != 3 or 0 in qkv.shape or qkv.shape[2] % (3 * num_heads):
        raise ValueError(f'qkv of shape {tuple(qkv.shape)} is invalid; expected '
                         f'(B, N, 3C), none of them zero, with C divisible by '
                         f'num_heads={num_heads}.')
    if qkv.dtype not in (torch.float32, torch.float64):
        raise ValueError(f'qkv of dtype {qkv.dtype} is invalid; expected float32 '
                         f'or float64.')
    if key_mask is not None and (key_mask.shape != qkv.shape[:2]
                                 or key_mask.dtype != torch.bool):
        raise ValueError(f'key_mask of shape {tuple(key_mask.shape)} and dtype '
                         f'{key_mask.dtype} is invalid; expected booleans of shape '
                         f'{tuple(qkv.shape[:2])}.')


class _Sizes(NamedTuple):
    """The sizes, grids and constants of one call's launches."""
    batch: int
    num_tokens: int
    num_heads: int
    head_dim: int
    tokens_per_split: int
    num_splits: int
    block_n: int
    block_d: int
    precision: str

    @property
    def batch_heads(self) -> int:
        return self.batch * self.num_heads

    @property
    def split_grid(self) -> Tuple[int, int]:
        """A program per split of the tokens of each image and head."""
        return self.num_splits, self.batch_heads

    @property
    def tile_constants(self) -> dict:
        """The constants and options of the kernels that loop over tiles."""
        return dict(BLOCK_N=self.block_n, BLOCK_D=self.block_d,
                    PRECISION=self.precision, num_warps=NUM_WARPS,
                    num_stages=NUM_STAGES)


def _launch_sizes(qkv: torch.Tensor, num_heads: int,
                  key_mask: Optional[torch.Tensor]) -> _Sizes:
    """The launches' sizes for one qkv (B, N, 3C), checked: the tokens of each
    (image, head) split into about TARGET_PROGRAMS / (B h) runs of whole tiles."""
    _check_inputs(qkv, num_heads, key_mask)
    batch, num_tokens, channels = qkv.shape
    head_dim = channels // (3 * num_heads)
    block_n = BLOCK_TOKENS[qkv.dtype]
    tiles = triton.cdiv(num_tokens, block_n)
    splits = min(tiles, max(1, TARGET_PROGRAMS // (batch * num_heads)))
    tokens_per_split = triton.cdiv(tiles, splits) * block_n
    return _Sizes(batch, num_tokens, num_heads, head_dim, tokens_per_split,
                  num_splits=triton.cdiv(num_tokens, tokens_per_split),
                  block_n=block_n,
                  block_d=max(16, triton.next_power_of_2(head_dim)),
                  precision=dot_precision(qkv.dtype, float32_accurate=False))


def _empty(like: torch.Tensor, *shape: int) -> torch.Tensor:
    """An uninitialised tensor of ``like``'s dtype and device."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _key_mask_arguments(key_mask: Optional[torch.Tensor], qkv: torch.Tensor) -> tuple:
    """The key mask's pointer and strides; qkv stands in for a missing mask."""
    if key_mask is None:
        return qkv, 0, 0
    return key_mask, *key_mask.stride()


def xnorm_forward(qkv: torch.Tensor, num_heads: int, gamma_q: torch.Tensor,
                  gamma_kv: torch.Tensor, key_mask: Optional[torch.Tensor],
                  eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``XNorm(Q) . XNorm(K^T V)`` per image and head, in three launches.

    Args:
        qkv: The qkv projection (B, N, 3C), float32 or float64, any strides:
            Q, K and V along the last dimension, each laid out (h, d).
        num_heads: h.
        gamma_q, gamma_kv: The heads' scales (h, ).
        key_mask: (B, N) booleans, True at the tokens that are keys, or None
            for all of them.
        eps: The lower bound of the norms.

    Returns:
        out: The heads merged (B, N, C), contiguous, in qkv's dtype.
        context: K^T V (B, h, d, d), contiguous, for :func:`xnorm_backward`.
    """
    sizes = _launch_sizes(qkv, num_heads, key_mask)
    batch, num_tokens, head_dim = sizes.batch, sizes.num_tokens, sizes.head_dim
    key_mask_ptr, *key_mask_strides = _key_mask_arguments(key_mask, qkv)
    partials = _empty(qkv, sizes.batch_heads, sizes.num_splits, head_dim, head_dim)
    context = _empty(qkv, batch, num_heads, head_dim, head_dim)
    out = _empty(qkv, batch, num_tokens, num_heads * head_dim)

    _context_partials_kernel[sizes.split_grid](
        qkv, key_mask_ptr, partials, num_tokens, num_heads, head_dim,
        sizes.tokens_per_split, *qkv.stride(), *key_mask_strides,
        HAS_KEY_MASK=key_mask is not None, **sizes.tile_constants)
    _context_sum_kernel[(sizes.batch_heads, )](
        partials, context, sizes.num_splits, head_dim, BLOCK_D=sizes.block_d,
        num_warps=NUM_WARPS)
    _output_kernel[sizes.split_grid](
        qkv, context, gamma_q, gamma_kv, out, num_tokens, num_heads, head_dim,
        sizes.tokens_per_split, *qkv.stride(), *out.stride(), EPS=float(eps),
        **sizes.tile_constants)
    return out, context


def xnorm_backward(grad_out: torch.Tensor, qkv: torch.Tensor, context: torch.Tensor,
                   num_heads: int, gamma_q: torch.Tensor, gamma_kv: torch.Tensor,
                   key_mask: Optional[torch.Tensor], eps: float
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`xnorm_forward`, in three launches.

    Per image and head, with G (N, d) the gradient of out, ``t_n = max(|q_n|,
    eps)``, ``q^_n = q_n / t_n``, ``s_c = max(n_c, eps)`` with ``n_c = |S[:,
    c]|``, ``u_c = S[:, c] / s_c`` (so ``S^ = g U``) and ``[.]`` 1 where true:

        d S^ = Q^^T G                                           # (d, d)
        d g = sum(d S^ * U),  d gamma_q = sum_b d g gamma_kv,  d gamma_kv =
            sum_b d g gamma_q
        d U = g d S^
        d S[:, c] = (d U[:, c] - [n_c >= eps] u_c (u_c . d U[:, c])) / s_c
        d K = V d S^T, zero at the padding tokens;  d V = K d S
        p_n = G_n S^^T,  d q_n = (p_n - [|q_n| >= eps] (q^_n . p_n) q^_n) / t_n

    Args:
        grad_out: The gradient of out (B, N, C), any strides.
        qkv, num_heads, gamma_q, gamma_kv, key_mask, eps: As given to
            :func:`xnorm_forward`.
        context: K^T V (B, h, d, d) as :func:`xnorm_forward` returned it.

    Returns:
        grad_qkv: The gradient of qkv (B, N, 3C), contiguous, in qkv's dtype.
        grad_gamma_q, grad_gamma_kv: The gammas' gradients (h, ), summed over
            the batch.
    """
    sizes = _launch_sizes(qkv, num_heads, key_mask)
    batch, num_tokens, head_dim = sizes.batch, sizes.num_tokens, sizes.head_dim
    key_mask_ptr, *key_mask_strides = _key_mask_arguments(key_mask, qkv)
    partials = _empty(qkv, sizes.batch_heads, sizes.num_splits, head_dim, head_dim)
    grad_context = _empty(qkv, sizes.batch_heads, head_dim, head_dim)
    grad_gamma = _empty(qkv, batch, num_heads)  # d g per image and head
    grad_qkv = _empty(qkv, *qkv.shape)
    grad_gamma_q = torch.empty_like(gamma_q)
    grad_gamma_kv = torch.empty_like(gamma_kv)

    _query_grad_kernel[sizes.split_grid](
        grad_out, qkv, context, gamma_q, gamma_kv, grad_qkv, partials,
        num_tokens, num_heads, head_dim, sizes.tokens_per_split,
        *grad_out.stride(), *qkv.stride(), *grad_qkv.stride(),
        EPS=float(eps), **sizes.tile_constants)
    _context_grad_kernel[(sizes.batch_heads, )](
        partials, context, gamma_q, gamma_kv, grad_context, grad_gamma,
        sizes.num_splits, num_heads, head_dim, EPS=float(eps),
        BLOCK_D=sizes.block_d, num_warps=NUM_WARPS)
    _key_value_grad_kernel[sizes.split_grid](
        qkv, key_mask_ptr, grad_context, grad_gamma, gamma_q, gamma_kv, grad_qkv,
        grad_gamma_q, grad_gamma_kv, batch, num_tokens, num_heads, head_dim,
        sizes.tokens_per_split,
        *qkv.stride(), *key_mask_strides, *grad_qkv.stride(),
        HAS_KEY_MASK=key_mask is not None, BLOCK_B=BLOCK_IMAGES,
        **sizes.tile_constants)
    return grad_qkv, grad_gamma_q, grad_gamma_kv
