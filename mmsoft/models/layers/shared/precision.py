"""Numerics under mixed precision."""
import torch


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """Casts half/bfloat16 tensors to float32; float32/64 pass through."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor
