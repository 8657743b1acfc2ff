"""timm's own model tests (``test_models.py``, vendored) on mmsoft's timm names.

Of timm's tests, the items parametrized with one of mmsoft's names and marked
``base``, ``cfg``, ``features``, ``forward`` or ``backward`` are kept; the rest
are deselected, as ``-m`` deselects. Collection fails when a name lacks a test
in :data:`REQUIRED_TESTS`. Every item is marked ``frameworks``. Without timm
(the floor environment) the file is not collected.
"""
import importlib.util
import os.path as osp

import pytest

HAS_TIMM = importlib.util.find_spec('timm') is not None
VENDORED_FILE = osp.join(osp.dirname(osp.abspath(__file__)), 'test_models.py')
collect_ignore = [] if HAS_TIMM else ['test_models.py']

#: timm's markers of the tests run on mmsoft's names.
KEPT_MARKERS = ('base', 'cfg', 'features', 'forward', 'backward')
#: The tests every name gets: mmsoft's models are listed in ``NON_STD_FILTERS``
#: and their module in ``FEAT_INTER_FILTERS``.
REQUIRED_TESTS = ('test_model_forward', 'test_model_backward',
                  'test_model_default_cfgs_non_std', 'test_model_forward_intermediates',
                  'test_model_forward_intermediates_features')

if HAS_TIMM:
    import mmsoft.timm_models  # registers the names before test_models.py lists them
    NAMES = sorted(mmsoft.timm_models.default_cfgs)


def _is_vendored(item: pytest.Item) -> bool:
    return str(item.path) == VENDORED_FILE


def _is_kept(item: pytest.Item) -> bool:
    callspec = getattr(item, 'callspec', None)
    model_name = callspec.params.get('model_name') if callspec else None
    return model_name in NAMES and any(
        item.get_closest_marker(marker) for marker in KEPT_MARKERS)


def _selects_node_ids(config: pytest.Config) -> bool:
    """Whether the command line names tests of the vendored file (``file::test``)."""
    return any('::' in arg and osp.abspath(arg.split('::')[0]) == VENDORED_FILE
               for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Keeps timm's tests of mmsoft's names; fails collection on a missing one.

    Runs before ``-m`` and ``-k`` deselect, which then see the ``frameworks`` mark.

    Raises:
        pytest.UsageError: A name of ``NAMES`` lacks a test of ``REQUIRED_TESTS``.
    """
    if not any(_is_vendored(item) for item in items):
        return
    kept, deselected = [], []
    for item in items:
        if _is_vendored(item):
            item.add_marker(pytest.mark.frameworks)
            if not _is_kept(item):
                deselected.append(item)
                continue
        kept.append(item)
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept
    if _selects_node_ids(config):
        return
    collected = {(item.originalname, item.callspec.params['model_name'])
                 for item in kept if _is_vendored(item)}
    missing = [f'{test}[{name}]' for name in NAMES for test in REQUIRED_TESTS
               if (test, name) not in collected]
    if missing:
        raise pytest.UsageError(
            f'{VENDORED_FILE} collected no item for {len(missing)} of mmsoft\'s '
            f'tests: {", ".join(missing)}. Every name of mmsoft.timm_models must be '
            f'in NON_STD_FILTERS and its module in FEAT_INTER_FILTERS (and not in '
            f'EXCLUDE_FILTERS, which excludes *huge* where GITHUB_ACTIONS is set).')
