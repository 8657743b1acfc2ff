"""The repository's command-line tools as modules, for tests that call their
functions in the test's process."""
import contextlib
import importlib.util
import io
import os
import os.path as osp
import warnings

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def load_tool(path: str):
    """``tools/<path>.py`` (e.g. ``'test'``, ``'deployment/export_onnx'``) as a
    module, not run."""
    spec = importlib.util.spec_from_file_location(
        'mmsoft_tool_' + path.replace('/', '_'), osp.join(REPO, 'tools', f'{path}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_process(tool: str, argv: list) -> str:
    """``tools/<tool>.py``'s ``main(argv)`` in this process, where mmdet and
    mmseg are imported already (a new process spends about ten seconds of CPU
    on that): returns what the run printed, its warnings included, as a
    process's output would read. The environment is restored afterwards (the
    tools set ``LOCAL_RANK``)."""
    output, environ = io.StringIO(), dict(os.environ)
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output), \
                warnings.catch_warnings():
            warnings.simplefilter('always')
            # Where the tool's process writes them (pytest records them).
            warnings.showwarning = lambda *warning, **_: output.write(
                warnings.formatwarning(*warning[:4]))
            load_tool(tool).main(argv)
    except BaseException:
        print(output.getvalue()[-6000:])  # in pytest's report of the failure
        raise
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return output.getvalue()
