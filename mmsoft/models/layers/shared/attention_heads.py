"""Splitting tokens into attention heads and merging them back."""
import torch


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, h * d) -> (B, h, N, d)."""
    batch, tokens, channels = x.shape
    return x.reshape(batch, tokens, num_heads, channels // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h * d)."""
    batch, heads, tokens, dims = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * dims)
