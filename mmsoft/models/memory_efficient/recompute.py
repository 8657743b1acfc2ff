"""Layers whose backward recomputes their intermediate tensors.

``torch.utils.checkpoint`` (non-reentrant) keeps a function's inputs
instead of the tensors its operations would keep, and backward runs the
function again to rebuild them. Two of UFO-ViT's layers run that way:

* UFO attention (:func:`recomputed`): the attention function keeps Q, K
  and V (views of the QKV projection's output, kept anyway); backward
  recomputes their float32 copies, ``K^T V`` and both XNorms.
* The local patch interaction: its ``DWConv -> act -> BatchNorm ->
  DWConv`` keeps only its input grid; backward recomputes the three
  intermediate maps (all depth-wise, hence cheap).

The backbones' ``with_cp`` checkpoints whole blocks the same way
(:func:`recomputed`). A BatchNorm in training updates its running statistics
at every call, so every rerun is told from the forward pass
(:func:`is_recomputing`, also inside a block that an outer checkpoint
reruns): there a BatchNorm normalises with the same batch statistics and
updates nothing (:func:`batch_norm_once`). The running statistics then move
once per step, as without checkpoints.
"""
import threading
from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator

import torch
import torch.nn as nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

_STATE = threading.local()


def is_recomputing() -> bool:
    """Whether a function checkpointed by :func:`recomputed` is being run
    again by backward (at any depth of nested checkpoints)."""
    return getattr(_STATE, 'recomputing', False)


@contextmanager
def _recomputing(rerun: bool) -> Iterator[None]:
    outer = is_recomputing()
    _STATE.recomputing = outer or rerun
    try:
        yield
    finally:
        _STATE.recomputing = outer


class FirstPassFlag:
    """True at its first call (the forward pass), False at every later one
    (the recomputations of backward)."""

    def __init__(self):
        self.called = False

    def __call__(self) -> bool:
        first = not self.called
        self.called = True
        return first


def recomputed(function: Callable, *args):
    """``function(*args)`` keeping only ``args`` for backward, which runs
    ``function`` again; during that rerun :func:`is_recomputing` is True, and
    ``function`` must update no state then."""
    first_pass = FirstPassFlag()

    def run(*inputs):
        with _recomputing(not first_pass()):
            return function(*inputs)

    return checkpoint(run, *args, use_reentrant=False)


def batch_norm_without_update(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` computed again: the module itself (a SyncBatchNorm
    included, with its synchronised batch statistics) run on copies of its
    buffers, so that its running statistics are not updated a second time.

    Not :func:`~.norm_act_conv.normalise_like_forward`, which passes no
    running statistics in training: this saves for backward exactly the
    tensors ``norm(x)`` saves, as the checkpoint's recomputation must.
    """
    if not norm.training:
        return norm(x)
    buffers = {name: buffer.clone() for name, buffer in norm.named_buffers()}
    return functional_call(norm, buffers, (x, ))


def batch_norm_once(norm: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``norm``, or while a checkpoint reruns (:func:`is_recomputing`) its
    rerun that updates no running statistics."""
    return partial(batch_norm_without_update, norm) if is_recomputing() else norm


def recomputes_locally(norm: nn.Module) -> bool:
    """Whether a memory-saving function may recompute ``norm`` from its own
    input alone: a plain BatchNorm2d (a SyncBatchNorm's statistics span the
    processes, which mmengine's ``sync_bn`` converts every BatchNorm to)."""
    return type(norm) is nn.BatchNorm2d
