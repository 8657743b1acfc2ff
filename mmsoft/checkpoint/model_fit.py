"""Whether a checkpoint file holds the weights of a given model."""
import re

from .safe_load import load_state_dict_safely


def unwrap_model(model):
    """The model inside DDP-like wrappers."""
    return model.module if hasattr(model, 'module') else model


def check_checkpoint_fits(path: str, model, config_path: str,
                          min_match: float = 0.5) -> None:
    """Checks that ``path`` loads and that its weights fit ``model``.

    Args:
        path (str): Checkpoint file.
        model (nn.Module): The built model.
        config_path (str): Named in the messages.
        min_match (float): Least fraction of the model's tensors that must be
            found in the checkpoint by name and shape. Default: 0.5.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is truncated, corrupt, not a checkpoint, holds
            objects outside the allow-list, or its weights belong to another
            model; the message names the file and the reason.
    """
    state_dict = load_state_dict_safely(path)
    state_dict = {re.sub(r'^module\.', '', k): v for k, v in state_dict.items()}
    expected = unwrap_model(model).state_dict()
    matched = [k for k, v in expected.items()
               if k in state_dict and tuple(state_dict[k].shape) == tuple(v.shape)]
    if len(matched) < min_match * len(expected):
        missing = [k for k in expected if k not in state_dict][:3]
        unexpected = [k for k in state_dict if k not in expected][:3]
        reshaped = [f'{k} {tuple(state_dict[k].shape)} vs {tuple(v.shape)}'
                    for k, v in expected.items()
                    if k in state_dict and k not in matched][:3]
        raise ValueError(
            f'checkpoint file {path} does not fit the model of {config_path}: '
            f'only {len(matched)} of {len(expected)} weight tensors match by name '
            f'and shape (missing e.g. {missing}; unexpected e.g. {unexpected}; '
            f'shape mismatches e.g. {reshaped}); is it a checkpoint of another '
            f'model?')
