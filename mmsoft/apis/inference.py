"""One image through mmdet's ``DetInferencer`` or mmseg's
``MMSegInferencer``, built from an mmsoft config and checkpoint, with the
predictions painted by the library's visualizer."""
from typing import Optional, Union

import numpy as np
from mmengine.registry import DefaultScope

from mmsoft.checkpoint import check_checkpoint_fits

from .checkpoints import require_checkpoint
from .config import library_of, load_config
from .runner import check_imports_mmsoft

#: mmdet's default least score of a painted instance.
DEFAULT_SCORE_THR = 0.3


def inferencer_class(library: str, config_path: str) -> type:
    """``DetInferencer`` (mmdet) or ``MMSegInferencer`` (mmseg).

    Raises:
        ValueError: ``library`` is neither, naming the config.
    """
    if library == 'mmdet':
        from mmdet.apis import DetInferencer
        return DetInferencer
    if library == 'mmseg':
        from mmseg.apis import MMSegInferencer
        return MMSegInferencer
    raise ValueError(f"inference takes mmdet or mmseg configs; {config_path} "
                     f"has default_scope='{library}'")


def build_inferencer(config: str, checkpoint: str, device: str = 'cpu'):
    """The library's inferencer of a config and a checkpoint.

    The config is read as the tools read it (its ``custom_imports`` imported)
    and must import mmsoft; the inferencer is built in the library's scope,
    and the checkpoint is checked against its model.

    Args:
        config (str): An mmdet or mmseg config file.
        checkpoint (str): Its checkpoint file.
        device (str): ``'cpu'``, ``'cuda'``, ``'cuda:1'``... Default: 'cpu'.

    Returns:
        DetInferencer or MMSegInferencer: The inferencer.

    Raises:
        FileNotFoundError: ``config`` or ``checkpoint`` does not exist.
        KeyError: The model uses an mmsoft type and the config does not
            import mmsoft.
        ValueError: Not an mmdet or mmseg config; a checkpoint that is not
            one of this model.
    """
    cfg = load_config(config)
    library = library_of(cfg, config)
    inferencer_type = inferencer_class(library, config)
    check_imports_mmsoft(cfg, config)
    require_checkpoint(checkpoint)
    with DefaultScope.overwrite_default_scope(library):
        inferencer = inferencer_type(model=cfg, weights=checkpoint,
                                     device=device, scope=library)
    check_checkpoint_fits(checkpoint, inferencer.model, config)
    return inferencer


def paint_options(library: str, score_thr: Optional[float]) -> dict:
    """The inferencer's drawing options: mmdet's ``pred_score_thr``.

    Raises:
        ValueError: ``score_thr`` outside [0, 1], or given for mmseg.
    """
    if library == 'mmseg':
        if score_thr is not None:
            raise ValueError(f'score_thr={score_thr} is for detectors; '
                             'segmentors paint every pixel\'s class')
        return {}
    score_thr = DEFAULT_SCORE_THR if score_thr is None else score_thr
    if not 0 <= score_thr <= 1:
        raise ValueError(f'score_thr must be in [0, 1], got {score_thr}')
    return dict(pred_score_thr=score_thr)


def paint_predictions(config: str, checkpoint: str,
                      image: Union[str, np.ndarray], out_file: str,
                      device: str = 'cpu',
                      score_thr: Optional[float] = None) -> Union[dict, np.ndarray]:
    """Predicts one image and writes it painted with the predictions.

    Args:
        config (str): An mmdet or mmseg config file.
        checkpoint (str): Its checkpoint file (class names and palette are
            taken from its ``meta.dataset_meta``, as the inferencers do).
        image (str or np.ndarray): An image file, or a uint8 (H, W, 3) BGR
            array.
        out_file (str): The painted image (folders are created), (H, W)
            as the input.
        device (str): Default: 'cpu'.
        score_thr (float, optional): Detectors: least score of a painted
            instance. Default: None (0.3, mmdet's default).

    Returns:
        dict or np.ndarray: The inferencer's prediction of the image:
        mmdet: ``labels``, ``scores``, ``bboxes`` (and ``masks`` as RLE);
        mmseg: the (H, W) class map.
    """
    import mmcv
    inferencer = build_inferencer(config, checkpoint, device)
    library = inferencer.scope
    options = paint_options(library, score_thr)
    with DefaultScope.overwrite_default_scope(library):
        result = inferencer(image, return_vis=True, **options)
    prediction, painted = result['predictions'], result['visualization']
    if library == 'mmdet':  # one image: lists of one
        prediction, painted = prediction[0], painted[0]
    mmcv.imwrite(painted[..., ::-1], out_file)  # (H, W, 3) RGB -> BGR file
    return prediction


def describe_prediction(prediction: Union[dict, np.ndarray],
                        score_thr: Optional[float] = None) -> str:
    """What a painted prediction shows: ``'2 of 100 instances'`` (those at
    ``score_thr`` or above) or ``'classes [0, 1, 3]'``."""
    if isinstance(prediction, dict):
        least = DEFAULT_SCORE_THR if score_thr is None else score_thr
        shown = sum(score >= least for score in prediction['scores'])
        return f'{shown} of {len(prediction["scores"])} instances'
    return f'classes {sorted(np.unique(prediction).tolist())}'
