"""``--show-dir``, ``--show`` and ``--wait-time``: the library's visualization
hook paints the test images with the predictions, into a folder or a window.

As in mmdet's and mmseg's ``tools/test.py``, ``--show`` opens a matplotlib
window per image and goes on after ``--wait-time`` seconds (0: after a key
press), and the visualizer then stores nothing in its vis backends (the
hook's rule). Without a display, matplotlib falls back to its
non-interactive ``agg`` backend: the images are drawn but no window opens
and each still waits ``--wait-time`` seconds, as with the libraries' tools;
that is announced by a warning, and ``--wait-time 0`` (which would wait
forever) is refused.
"""
import warnings
from typing import Optional

from mmengine.config import Config

#: Seconds ``--show`` keeps each image, the libraries' default.
DEFAULT_WAIT_TIME = 2.0


def non_interactive_backends() -> frozenset:
    """matplotlib's built-in backends that cannot open a window (lower case)."""
    try:
        from matplotlib.backends import BackendFilter, backend_registry
        names = backend_registry.list_builtin(BackendFilter.NON_INTERACTIVE)
    except ImportError:  # matplotlib < 3.9
        from matplotlib import rcsetup
        names = rcsetup.non_interactive_bk
    return frozenset(name.lower() for name in names)


def check_show(wait_time: float) -> None:
    """Checks ``--wait-time`` and warns when ``--show`` cannot open a window.

    Raises:
        ValueError: ``wait_time`` is negative, or 0 with a non-interactive
            matplotlib backend (no window could be closed to go on).
    """
    if wait_time < 0:
        raise ValueError(f'--wait-time must be >= 0 seconds (0: wait for a key '
                         f'press), got {wait_time}')
    import matplotlib
    backend = matplotlib.get_backend()
    if backend.lower() not in non_interactive_backends():
        return
    if wait_time == 0:
        raise ValueError(
            f"--show --wait-time 0 waits for a key press in a window, but "
            f"matplotlib's backend '{backend}' opens none (no display?): set "
            'MPLBACKEND to an interactive backend (e.g. TkAgg) on a machine '
            'with a display, or use --show-dir DIR to keep the painted images')
    warnings.warn(
        f"--show: matplotlib's backend '{backend}' cannot open windows (no "
        f'display?); the painted predictions are drawn but not shown, each '
        f'after {wait_time} s, as with mmdet\'s and mmseg\'s tools. Use '
        '--show-dir DIR to keep them as files.')


def enable_visualization(cfg: Config, library: str,
                         show_dir: Optional[str] = None, show: bool = False,
                         wait_time: float = DEFAULT_WAIT_TIME) -> None:
    """Turns on the visualization hook for every test image.

    Args:
        cfg (Config): The config, changed in place.
        library (str): ``'mmdet'`` or ``'mmseg'``.
        show_dir (str, optional): ``--show-dir``: an absolute folder for the
            painted images. Default: None.
        show (bool): ``--show``: show each painted image in a window.
            Default: False.
        wait_time (float): ``--wait-time``: seconds each window stays.
            Default: 2.0.

    Raises:
        ValueError: The config has no ``default_hooks.visualization``; or a
            ``wait_time`` :func:`check_show` refuses.
    """
    hooks = cfg.get('default_hooks') or {}
    if 'visualization' not in hooks:
        options = ' and '.join(name for name, given in (
            ('--show-dir', show_dir), ('--show', show)) if given)
        raise ValueError(f'{options or "--show-dir"} needs '
                         "default_hooks.visualization (the library's "
                         'VisualizationHook) in the config')
    hook = hooks['visualization']
    hook['draw'] = True
    hook['interval'] = 1
    if show:
        check_show(wait_time)
        hook['show'] = True
        hook['wait_time'] = wait_time
    if show_dir and library == 'mmdet':
        # An absolute path: DetVisualizationHook joins it to work_dir/timestamp.
        hook['test_out_dir'] = show_dir
    elif show_dir:
        cfg.visualizer['save_dir'] = show_dir
