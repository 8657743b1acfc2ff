"""One boolean attribute set on every module of a model that has it."""
from typing import Optional

import torch.nn as nn


def switch_modules(model: nn.Module, mixin: type, attribute: str, enabled: bool,
                   argument: Optional[str] = None) -> nn.Module:
    """Sets ``attribute`` to ``enabled`` on every ``mixin`` module of ``model``.

    Args:
        model (nn.Module): Any module (``model`` itself included).
        mixin (type): The class whose instances hold the switch.
        attribute (str): The switch's name, e.g. ``'memory_efficient'``.
        enabled (bool): Its new value.
        argument (str, optional): The caller's name for ``enabled``, for the
            error. Default: None (``attribute``).

    Returns:
        nn.Module: ``model``.

    Raises:
        ValueError: If ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise ValueError(f'{argument or attribute}={enabled!r} is invalid; expected '
                         f'True or False.')
    for module in model.modules():
        if isinstance(module, mixin):
            setattr(module, attribute, enabled)
    return model
