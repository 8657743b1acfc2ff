"""Peers' own test files, vendored under tests/vendor/, on mmsoft's names.

A vendored test runs on every mmsoft name it is collected for, unless a list
of its :class:`Peer` says otherwise, with the reason: ``dropped`` (on no
name), ``tiny_only`` (on :data:`TINY_NAMES` only), ``skipped`` (collected,
then skipped) or ``xfailed`` (expected to fail, strictly). An entry names a
test, or ``FILE::test`` for the test of one of the peer's files.

:class:`PeerSelection`, a pytest plugin, applies the lists and fails the run
(a usage error) when an entry matches no collected test, a name lacks a
required test, or something else (``-m``, another plugin) deselects a test
the lists keep. It reports the counts per vendored file after collection.
"""
import functools
import inspect
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pytest

#: One name per family (SOFT, SOFT++, UFO-ViT), small enough for a CPU run.
TINY_NAMES = ('soft_tiny', 'soft_plus_plus_tiny', 'ufo_vit_tiny')
#: The lists of a :class:`Peer`.
LISTS = ('dropped', 'tiny_only', 'skipped', 'xfailed')


@dataclass(frozen=True)
class Peer:
    """A peer's vendored test files and what of them does not run as is.

    Attributes:
        directory: The peer's folder (absolute).
        files: The vendored files whose tests are counted, relative to it.
        names: The mmsoft names the tests are collected for.
        required: Tests every name of ``names`` must get (those of
            ``tiny_only``: every tiny name of ``names``).
        dropped: Entry -> why it runs on no mmsoft name.
        tiny_only: Entry -> why it runs on :data:`TINY_NAMES` only.
        skipped: Entry -> why it is skipped.
        xfailed: Entry -> (the exception it raises, why: the upstream issue).
    """
    directory: str
    files: Tuple[str, ...]
    names: Tuple[str, ...]
    required: Tuple[str, ...] = ()
    dropped: Mapping[str, str] = field(default_factory=dict)
    tiny_only: Mapping[str, str] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    xfailed: Mapping[str, Tuple[type, str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return osp.basename(self.directory)

    def entries(self) -> Dict[str, str]:
        """Every list entry -> its list's name."""
        return {entry: kind for kind in LISTS for entry in getattr(self, kind)}

    def entry(self, kind: str, path: str, test: str) -> Optional[str]:
        """The entry of list ``kind`` for ``test`` of file ``path``, if any."""
        entries = getattr(self, kind)
        return next((key for key in (f'{path}::{test}', test) if key in entries), None)

    def reason(self, entry: str) -> str:
        reason = getattr(self, self.entries()[entry])[entry]
        return reason[1] if isinstance(reason, tuple) else reason


def model_name(item: pytest.Item) -> Optional[str]:
    """The model an item tests: its ``model_name`` parameter (timm's tests) or
    its class's ``model_name`` attribute (mmsoft's subclasses of a peer's
    test classes)."""
    callspec = getattr(item, 'callspec', None)
    if callspec is not None and 'model_name' in callspec.params:
        return callspec.params['model_name']
    return getattr(getattr(item, 'cls', None), 'model_name', None)


@functools.lru_cache(maxsize=None)
def _source_file(function) -> Optional[str]:
    path = inspect.getsourcefile(inspect.unwrap(function))
    return osp.abspath(path) if path else None


def selects_subset(config: pytest.Config) -> bool:
    """Whether the command line picks tests (``-k``, node ids, ``--lf``)."""
    return bool(config.option.keyword or config.getoption('lf', False)
                or any('::' in arg for arg in config.args))


class PeerSelection:
    """The pytest plugin that runs the peers' tests as their lists say."""

    def __init__(self, peers: Sequence[Peer]):
        self.peers = list(peers)
        self.counts: Dict[str, Dict[str, Dict[str, int]]] = {}
        self.kept: Dict[str, set] = {}

    def _peer_file(self, peer: Peer, item: pytest.Item) -> Optional[str]:
        """The vendored file (relative) defining ``item``'s test, if the peer's."""
        function = getattr(item, 'function', None)
        if function is None or not str(item.path).startswith(peer.directory + osp.sep):
            return None
        source = _source_file(function)
        return next((path for path in peer.files
                     if source == osp.join(peer.directory, path)), None)

    def select(self, config: pytest.Config, items: List[pytest.Item],
               peer: Peer) -> None:
        """Keeps the peer's tests of mmsoft's names as its lists say.

        An item of a vendored file for another model (timm's own) is
        deselected; one for a name of ``peer.names`` is marked ``frameworks``
        and kept, skipped or expected to fail unless its test is dropped.

        Raises:
            pytest.UsageError: A list entry that matches no collected test, or
                a name without a required test (unless the command line picks
                tests).
        """
        kept, deselected, listed, collected = [], [], set(), set()
        counts = {path: dict(collected=0, dropped=0) for path in peer.files}
        for item in items:
            path = self._peer_file(peer, item)
            name = model_name(item) if path else None
            if path is None:
                kept.append(item)
                continue
            if name not in peer.names:
                deselected.append(item)
                continue
            test = item.originalname
            counts[path]['collected'] += 1
            collected.add((test, name))
            item.add_marker(pytest.mark.frameworks)
            found = {kind: peer.entry(kind, path, test) for kind in LISTS}
            listed.update(entry for entry in found.values() if entry)
            if found['dropped'] or (found['tiny_only'] and name not in TINY_NAMES):
                counts[path]['dropped'] += 1
                deselected.append(item)
                continue
            if found['skipped']:
                item.add_marker(pytest.mark.skip(reason=peer.reason(found['skipped'])))
            if found['xfailed']:
                raises, reason = peer.xfailed[found['xfailed']]
                item.add_marker(pytest.mark.xfail(raises=raises, reason=reason,
                                                  strict=True))
            kept.append(item)
        if not deselected and not any(count['collected'] for count in counts.values()):
            return  # none of the peer's files collected
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
        self.counts[peer.name] = counts
        self.kept[peer.name] = {item.nodeid for item in kept
                                if self._peer_file(peer, item)}
        if selects_subset(config):
            return
        stale = sorted(set(peer.entries()) - listed)
        if stale:
            raise pytest.UsageError(
                f'{peer.directory}: the listed tests {stale} are collected for no '
                f'mmsoft name of {list(peer.names)}; remove the entries or fix them.')
        required = [(test, name) for name in peer.names for test in peer.required]
        required += [(entry.split('::')[-1], name) for name in TINY_NAMES
                     if name in peer.names for entry in peer.tiny_only]
        missing = [f'{test}[{name}]' for test, name in required
                   if (test, name) not in collected]
        if missing:
            raise pytest.UsageError(
                f'{peer.directory}: no test collected for {len(missing)} required '
                f'cases: {", ".join(missing)}.')

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list) -> None:
        """Applies the lists before ``-m`` and ``-k`` deselect (which then see
        the ``frameworks`` mark)."""
        for peer in self.peers:
            self.select(config, items, peer)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Fails the run when a test the lists keep is no longer collected.

        Raises:
            pytest.UsageError: Such a test was deselected (by ``-m`` or a
                plugin), and the command line does not pick tests.
        """
        if selects_subset(session.config):
            return
        final = {item.nodeid for item in session.items}
        for peer_name, kept in self.kept.items():
            lost = sorted(kept - final)
            if lost:
                shown = ', '.join(lost[:5]) + (f' and {len(lost) - 5} more'
                                               if len(lost) > 5 else '')
                raise pytest.UsageError(
                    f'{peer_name}: {len(lost)} tests of mmsoft\'s names were '
                    f'deselected without a listed reason: {shown}. List them with '
                    f'the reason (tests/vendor/conftest.py), or pick tests with -k.')

    def pytest_report_collectionfinish(self) -> List[str]:
        """One line per vendored file: its tests collected for mmsoft's names
        and those dropped as listed; then each entry with its reason."""
        lines = []
        for peer in self.peers:
            for path, count in self.counts.get(peer.name, {}).items():
                lines.append(f'{peer.name}/{path}: {count["collected"]} tests '
                             f'collected for mmsoft\'s names, {count["dropped"]} of '
                             f'them dropped as listed')
            if peer.name in self.counts:
                lines += [f'  {kind}: {entry}: {peer.reason(entry)}'
                          for entry, kind in peer.entries().items()]
        return lines
