"""The selection of the peers' vendored tests (tests/vendor/peer_tests.py):
a test collected for an mmsoft name runs unless listed with a reason, and
every other way out of the run fails it. Each case runs pytest on a small
peer of its own in a subprocess."""
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

UPSTREAM = '''
import pytest

@pytest.mark.parametrize('model_name', ['soft_tiny', 'soft_small', 'resnet18'])
def test_forward(model_name):
    pass

@pytest.mark.slow
@pytest.mark.parametrize('model_name', ['soft_tiny', 'soft_small'])
def test_prune(model_name):
    pass

@pytest.mark.parametrize('model_name', ['soft_tiny', 'soft_small'])
def test_hub(model_name):
    raise AssertionError('no network')
'''

CONFTEST = '''
import os.path as osp
from tests.vendor.peer_tests import Peer, PeerSelection

PEER = Peer(directory=osp.join(osp.dirname(osp.abspath(__file__)), 'peer'),
            files=('test_upstream.py', ), names=('soft_tiny', 'soft_small'),
            required={required!r}, tiny_only={tiny_only!r},
            skipped={{'test_hub': 'needs the Hub'}})


def pytest_configure(config):
    config.pluginmanager.register(PeerSelection([PEER]), 'peers')
'''

SLOW = {'test_prune': 'prunes every output'}


def run_peer(tmp_path, *args, required=('test_forward', ), tiny_only=SLOW):
    """pytest's exit code and output on the peer with these lists."""
    (tmp_path / 'peer').mkdir()
    (tmp_path / 'peer' / 'test_upstream.py').write_text(UPSTREAM)
    (tmp_path / 'conftest.py').write_text(textwrap.dedent(CONFTEST.format(
        required=required, tiny_only=tiny_only)))
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-rs', '-c',
         os.devnull, '--rootdir', str(tmp_path), '-m', 'not openmmlab', *args,
         str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_listed_tests_leave_with_their_reason(tmp_path):
    code, out = run_peer(tmp_path)
    assert code == 0, out
    # soft_* forward 2, prune on soft_tiny 1 (soft_small dropped), hub 2 skipped;
    # resnet18's test is not mmsoft's.
    assert '3 passed, 2 skipped, 2 deselected' in out
    assert ("peer/test_upstream.py: 6 tests collected for mmsoft's names, 1 of them "
            'dropped as listed') in out
    assert 'tiny_only: test_prune: prunes every output' in out
    assert 'needs the Hub' in out


def test_a_marker_filter_dropping_a_kept_test_fails_the_run(tmp_path):
    code, out = run_peer(tmp_path, '-m', 'not slow')
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert ("peer: 1 tests of mmsoft's names were deselected without a listed reason: "
            'peer/test_upstream.py::test_prune[soft_tiny]') in out


def test_picking_tests_with_k_is_allowed(tmp_path):
    code, out = run_peer(tmp_path, '-k', 'forward')
    assert code == 0 and '2 passed' in out, out


def test_an_entry_that_matches_nothing_fails_the_run(tmp_path):
    code, out = run_peer(tmp_path, tiny_only=dict(SLOW, test_renamed='gone'))
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert "the listed tests ['test_renamed'] are collected for no mmsoft name" in out


def test_a_missing_required_test_fails_the_run(tmp_path):
    code, out = run_peer(tmp_path, required=('test_forward', 'test_backward'))
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert ('no test collected for 2 required cases: test_backward[soft_tiny], '
            'test_backward[soft_small]') in out
