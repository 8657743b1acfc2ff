"""What autograd keeps for backward, by the module that was running.

Each saved storage counts once, for the innermost module running when it was
saved; parameters and buffers are left out.
"""
from collections import defaultdict
from typing import Dict, List, NamedTuple, Tuple

import torch
import torch.nn as nn


class SavedTensor(NamedTuple):
    """One storage kept for backward."""
    module: str  # innermost module running when it was saved ('' = the root)
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int  # bytes of the whole storage


class SavedTensorRecorder:
    """Context manager recording the storages autograd saves in ``model``,
    whose forward runs inside the context.

    Example::

        with SavedTensorRecorder(model) as recorder:
            loss = model(images)
        recorder.bytes_by_prefix(depth=1)  # {'backbone': ..., 'neck': ...}
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.records: List[SavedTensor] = []
        self._stack: List[str] = ['']
        self._seen = set()
        self._handles = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _leave(self, *_) -> None:
        self._stack.pop()  # a forward hook returning None keeps the output

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._seen:
            self._seen.add(storage.data_ptr())
            self.records.append(SavedTensor(self._stack[-1], tuple(tensor.shape),
                                            str(tensor.dtype).replace('torch.', ''),
                                            storage.nbytes()))
        return tensor

    def __enter__(self) -> 'SavedTensorRecorder':
        state = list(self.model.parameters()) + list(self.model.buffers())
        self._seen = {t.untyped_storage().data_ptr() for t in state}
        for name, module in self.model.named_modules():
            self._handles += [
                module.register_forward_pre_hook(
                    lambda *_, name=name: self._stack.append(name)),
                module.register_forward_hook(self._leave)]
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._hooks.__exit__(*exc_info)
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def total_bytes(self) -> int:
        """Bytes of all recorded storages."""
        return sum(record.nbytes for record in self.records)

    def bytes_by_prefix(self, depth: int) -> Dict[str, int]:
        """Bytes per module-name prefix of ``depth`` dot-separated parts (1:
        the root's children, ``'backbone'``; 2: ``'backbone.stages'``, ...),
        largest first; ``''`` holds what the root saved outside every child."""
        totals = defaultdict(int)
        for record in self.records:
            totals['.'.join(record.module.split('.')[:depth])] += record.nbytes
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def records_under(self, prefix: str) -> List[SavedTensor]:
        """The records of module ``prefix`` (``'backbone.stages.0'``; ``''``:
        the whole model) and its submodules, largest first (ValueError where
        ``prefix`` names no module)."""
        names = [name for name, _ in self.model.named_modules()]
        if prefix not in names:
            children = [name for name in names if name and '.' not in name]
            raise ValueError(f'prefix={prefix!r} names no module of the model; '
                             "expected a module name, e.g. one of its children "
                             f"{children}, or '' for the whole model.")
        inside = [r for r in self.records if not prefix or r.module == prefix
                  or r.module.startswith(prefix + '.')]
        return sorted(inside, key=lambda record: -record.nbytes)
