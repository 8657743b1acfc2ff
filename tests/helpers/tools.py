"""The repository's command-line tools as modules, for tests that call their
functions in the test's process."""
import importlib.util
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def load_tool(path: str):
    """``tools/<path>.py`` (e.g. ``'test'``, ``'deployment/export_onnx'``) as a
    module, not run."""
    spec = importlib.util.spec_from_file_location(
        'mmsoft_tool_' + path.replace('/', '_'), osp.join(REPO, 'tools', f'{path}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
