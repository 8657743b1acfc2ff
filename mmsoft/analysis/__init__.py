"""Cost analysis: FLOP handles, latency and memory measurement, peer models."""
from ..models.flop_handles import count_flops, extra_flop_handles, inverse_flops

__all__ = ['count_flops', 'extra_flop_handles', 'inverse_flops']
