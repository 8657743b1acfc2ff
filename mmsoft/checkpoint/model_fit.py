"""Whether a checkpoint file holds the weights of a given model."""
from .safe_load import load_state_dict_safely
from .state_dict import strip_prefixes
from .strict import compare_state_dict


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
    state_dict = strip_prefixes(load_state_dict_safely(path), ('module.', ))
    expected = unwrap_model(model).state_dict()
    result = compare_state_dict(state_dict, expected)
    matched = len(expected) - len(result.missing) - len(result.mismatched)
    if matched < min_match * len(expected):
        raise ValueError(
            f'checkpoint file {path} does not fit the model of {config_path}: '
            f'only {matched} of {len(expected)} weight tensors match by name '
            f'and shape ({result.describe(limit=3)}); is it a checkpoint of '
            f'another model?')
