"""Every dotted ``mmsoft.`` name the prose gives names something that exists.

The names are collected from ``README.md``, ``docs/**/*.md`` and
``configs/**/*.md``, and from the comments and string statements
(docstrings) of every Python file under ``mmsoft/``, ``tools/``, ``tests/``
and ``configs/``. A name such as ``mmsoft.models.soft.SOFT.forward`` is
resolved from its longest prefix that is a module file of the package
(``mmsoft.models.soft``): that module is imported and the rest looked up
with ``getattr``. When the import needs a package this
environment lacks (mmengine, mmdet, timm, ...), the rest is looked up in the
module's source instead: its top-level definitions and imports, a class's
body and its base classes. Needs only torch.
"""
import ast
import functools
import glob
import importlib
import io
import os
import os.path as osp
import re
import tokenize
from typing import Iterator, List, Optional, Tuple

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: A dotted name rooted at the package, not part of a longer word or path
#: (``soft2mmsoft.py``, ``soft++_tiny_mmsoft.pth``).
DOTTED_NAME = re.compile(r'(?<![\w./+-])mmsoft(?:\.[A-Za-z_]\w*)+')
#: The Markdown pages and the Python files whose prose is read (globs
#: relative to the repository; hidden folders such as ``mmsoft/.mim`` are
#: not matched).
PAGES = ('README.md', 'docs/**/*.md', 'configs/**/*.md')
PYTHON_FILES = ('mmsoft/**/*.py', 'tools/**/*.py', 'tests/**/*.py',
                'configs/**/*.py')


def _files(patterns) -> List[str]:
    """The files the globs select, relative to the repository.

    Raises:
        FileNotFoundError: When a glob selects no file.
    """
    found = []
    for pattern in patterns:
        paths = sorted(glob.glob(osp.join(REPO, pattern), recursive=True))
        if not paths:
            raise FileNotFoundError(f'pattern={pattern!r} selects no file under '
                                    f'{REPO}; expected a glob of existing files.')
        found += [osp.relpath(path, REPO) for path in paths]
    return found


# ----------------------------------------------------------------- collecting
def names_in_text(text: str, first_line: int = 1) -> Iterator[Tuple[int, str]]:
    """``(line, name)`` of each dotted name of ``text``, whose first line is
    ``first_line``."""
    for match in DOTTED_NAME.finditer(text):
        yield first_line + text.count('\n', 0, match.start()), match.group()


def names_in_python(source: str) -> Iterator[Tuple[int, str]]:
    """``(line, name)`` of each dotted name in the comments and the string
    statements (docstrings) of Python ``source``; code is not read."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield from names_in_text(token.string, token.start[0])
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            yield from names_in_text(ast.get_source_segment(source, node),
                                     node.lineno)


def collect_names() -> List[Tuple[str, int, str]]:
    """``(file, line, name)`` of every dotted name of the pages and files."""
    found = []
    for path in _files(PAGES):
        with open(osp.join(REPO, path), encoding='utf-8') as f:
            found += [(path, line, name) for line, name in names_in_text(f.read())]
    for path in _files(PYTHON_FILES):
        with open(osp.join(REPO, path), encoding='utf-8') as f:
            found += [(path, line, name) for line, name in names_in_python(f.read())]
    return found


# ------------------------------------------------------------------ resolving
def module_file(module: str) -> Optional[str]:
    """The source file of mmsoft module ``module`` in the checkout, or None."""
    base = osp.join(REPO, *module.split('.'))
    for path in (base + '.py', osp.join(base, '__init__.py')):
        if osp.isfile(path):
            return path
    return None


class Unresolved(Exception):
    """A name does not resolve; the message says where it stops."""


def _import_error_outside_package(error: ImportError) -> bool:
    """Whether ``error`` is a missing dependency, not a broken mmsoft import."""
    missing = error.name or ''
    return bool(missing) and missing.split('.')[0] != 'mmsoft'


@functools.lru_cache(maxsize=None)
def bindings(module: str) -> dict:
    """The names the source of ``module`` binds at its top level (inside
    ``if``/``try``/``with`` blocks too): name -> the defining node, or
    ``(import node, alias)`` for imports; ``'*'`` -> the star imports."""
    with open(module_file(module), encoding='utf-8') as f:
        return _body_bindings(ast.parse(f.read()).body)


def _body_bindings(body) -> dict:
    found = {'*': []}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == '*':
                    found['*'].append(node)
                else:
                    bound = alias.asname or alias.name.split('.')[0]
                    found[bound] = (node, alias)
        else:
            for field in ('body', 'orelse', 'finalbody', 'handlers'):
                for inner in getattr(node, field, None) or []:
                    inner_found = _body_bindings(
                        inner.body if isinstance(inner, ast.ExceptHandler)
                        else [inner])
                    found['*'] += inner_found.pop('*')
                    found.update(inner_found)
    return found


def _lazy_name(module: str, attr: str) -> bool:
    """Whether the source of ``module`` spells ``attr`` as a string (the
    names a module-level ``__getattr__`` imports on first use)."""
    with open(module_file(module), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    return any(isinstance(node, ast.Constant) and node.value == attr
               for node in ast.walk(tree))


def _submodules(module: str) -> List[str]:
    """The modules of package ``module`` (none for a plain module)."""
    path = module_file(module)
    if not path.endswith('__init__.py'):
        return []
    return [f'{module}.{name[:-3]}' for name in sorted(os.listdir(osp.dirname(path)))
            if name.endswith('.py') and name != '__init__.py']


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module ``from ... import`` names in ``module``, as an absolute name."""
    if not node.level:
        return node.module
    is_package = module_file(module).endswith('__init__.py')
    parts = module.split('.')
    package = parts if is_package else parts[:-1]
    base = package[:len(package) - node.level + 1]
    return '.'.join(base + ([node.module] if node.module else []))


def _imported_object(dotted: str):
    """The object ``dotted`` (a module, then attributes) imported."""
    parts = dotted.split('.')
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:end]))
        except ImportError:
            continue
        for attr in parts[end:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _member(target: tuple, attr: str) -> tuple:
    """``attr`` of a target: ``('module', name)``, ``('class', module,
    node)``, ``('object', obj)`` or ``('defined', what)``, whose members the
    source does not show.

    Raises:
        Unresolved: When the target has no such member.
    """
    kind = target[0]
    if kind == 'object':
        if not hasattr(target[1], attr):
            raise Unresolved(f'{target[1]!r} has no attribute {attr!r}')
        return ('object', getattr(target[1], attr))
    if kind == 'module':
        module = target[1]
        if module_file(module) is None:
            raise Unresolved(f'{module} is no module of the checkout')
        if module_file(f'{module}.{attr}'):
            return ('module', f'{module}.{attr}')
        found = bindings(module)
        if attr in found:
            return _bound(module, found[attr])
        for star in found['*']:
            try:
                return _member(('module', _absolute(module, star)), attr)
            except Unresolved:
                pass
        if '__getattr__' in found and _lazy_name(module, attr):
            for submodule in _submodules(module):
                try:
                    return _member(('module', submodule), attr)
                except Unresolved:
                    pass
        raise Unresolved(f'{module} ({osp.relpath(module_file(module), REPO)}) '
                         f'defines no {attr!r}')
    if kind == 'class':
        _, module, node = target
        members = _body_bindings(node.body)
        if attr in members:
            return _bound(module, members[attr])
        reasons = []
        for base in node.bases:
            try:
                return _member(_expression(module, base), attr)
            except Unresolved as why:
                reasons.append(f'{ast.unparse(base)}: {why}')
        raise Unresolved(f'class {node.name} of {module} defines no {attr!r} '
                         f'(bases: {"; ".join(reasons) or "none"})')
    raise Unresolved(f'{target[1]} ({kind}) has members the source does not '
                     f'show; {attr!r} cannot be looked up')


def _bound(module: str, binding) -> tuple:
    """The target a binding of ``module``'s source gives its name."""
    if isinstance(binding, ast.ClassDef):
        return ('class', module, binding)
    if isinstance(binding, tuple):  # an import
        node, alias = binding
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if source.split('.')[0] == 'mmsoft':
                return _member(('module', source), alias.name)
            dotted = f'{source}.{alias.name}'
        else:
            dotted = alias.name if alias.asname else alias.name.split('.')[0]
            if dotted.split('.')[0] == 'mmsoft':
                return ('module', dotted)
        try:
            return ('object', _imported_object(dotted))
        except (ImportError, AttributeError):
            return ('defined', f'{dotted} (not importable here)')
    return ('defined', f'{type(binding).__name__} of {module}')


def _expression(module: str, expr: ast.expr) -> tuple:
    """The target of a base-class expression in ``module`` (``Name``,
    ``a.b``, ``Generic[T]``)."""
    if isinstance(expr, ast.Name):
        return _member(('module', module), expr.id)
    if isinstance(expr, ast.Attribute):
        return _member(_expression(module, expr.value), expr.attr)
    if isinstance(expr, ast.Subscript):
        return _expression(module, expr.value)
    raise Unresolved(f'base {ast.unparse(expr)} of a class in {module} is not a name')


def resolve_in_source(module: str, attrs: List[str]) -> None:
    """Looks ``attrs`` up in the source of ``module``, importing nothing of
    mmsoft.

    Raises:
        Unresolved: When the source does not define them.
    """
    target = ('module', module)
    for attr in attrs:
        target = _member(target, attr)


def resolve(name: str, use_import: bool = True) -> None:
    """Resolves a dotted mmsoft name (see the module's docstring).

    Args:
        name (str): A module of the package, optionally followed by
            attributes.
        use_import (bool): Import the module when it imports here; False
            reads its source only. Default: True.

    Raises:
        Unresolved: When the name names nothing, saying where it stops.
    """
    parts = name.split('.')
    end = max((i for i in range(1, len(parts) + 1)
               if module_file('.'.join(parts[:i]))), default=0)
    if not end:
        raise Unresolved(f'no module of {parts[0]!r} in the checkout')
    module, attrs = '.'.join(parts[:end]), parts[end:]
    if use_import:
        try:
            obj = importlib.import_module(module)
        except ImportError as error:
            if not _import_error_outside_package(error):
                raise Unresolved(f'import {module} fails: {error!r}') from error
        else:
            for index, attr in enumerate(attrs):
                try:
                    found = hasattr(obj, attr)
                except ImportError as error:  # a lazy attribute's import
                    if not _import_error_outside_package(error):
                        raise Unresolved(f'{".".join(parts[:end + index + 1])} '
                                         f'fails to import: {error!r}') from error
                    break
                if not found:
                    raise Unresolved(f'{".".join(parts[:end + index])} has no '
                                     f'attribute {attr!r}')
                obj = getattr(obj, attr)
            else:
                return
    resolve_in_source(module, attrs)


# ---------------------------------------------------------------------- tests
def test_every_dotted_name_resolves():
    found = collect_names()
    assert len({name for _, _, name in found}) > 40, found
    broken = []
    for path, line, name in found:
        try:
            resolve(name)
        except Unresolved as why:
            broken.append(f'{path}:{line}: {name}: {why}')
    assert not broken, 'dotted names that name nothing:\n' + '\n'.join(broken)


def test_names_are_read_from_prose_only():
    source = ('"""See :class:`~mmsoft.models.soft.SOFT` and mmsoft.models."""\n'
              'import mmsoft.models.tracing  # not prose: mmsoft.models.layers\n'
              'x = "mmsoft.not_read"\n'
              'def f():\n'
              '    """Returns mmsoft.models.soft.SOFT.forward, not\n'
              '    soft2mmsoft.py or soft_mmsoft.pth."""\n')
    assert sorted(names_in_python(source)) == [
        (1, 'mmsoft.models'), (1, 'mmsoft.models.soft.SOFT'),
        (2, 'mmsoft.models.layers'), (5, 'mmsoft.models.soft.SOFT.forward')]
    assert list(names_in_text('a\n`mmsoft.models.layers.gelu`.\n')) == [
        (2, 'mmsoft.models.layers.gelu')]


@pytest.mark.parametrize('use_import', [True, False])
@pytest.mark.parametrize('name', [
    'mmsoft.models', 'mmsoft.SOFT', 'mmsoft.models.soft.SOFT.forward',
    'mmsoft.models.soft.SoftAttention', 'mmsoft.models.soft.set_exportable',
    'mmsoft.models.soft.SOFT.train',  # from torch's nn.Module
    'mmsoft.models.soft.SOLVERS'])
def test_existing_names_resolve(name, use_import):
    resolve(name, use_import=use_import)


@pytest.mark.parametrize('use_import', [True, False])
@pytest.mark.parametrize('name, missing', [
    ('mmsoft.models.tracing.Exportable', 'tracing'),
    ('mmsoft.models.common.SoftAttention', 'SoftAttention'),
    ('mmsoft.models.soft.SOFT.no_such_method', 'no_such_method'),
    ('mmsoft.nowhere', 'nowhere')])
def test_missing_names_raise(name, missing, use_import):
    with pytest.raises(Unresolved, match=f"'{missing}'"):
        resolve(name, use_import=use_import)


def test_source_lookup_names_the_file_it_read():
    with pytest.raises(Unresolved, match=r"mmsoft.models.common \(mmsoft/models/"
                       r"common.py\) defines no 'shared'"):
        resolve('mmsoft.models.common.shared.gelu', use_import=False)


def test_source_lookup_follows_imports_and_base_classes():
    """What the source shows: the OpenMMLab backbone's own methods, those of
    the plain model it subclasses (``soft.SOFT``, imported as a module) and
    of torch's ``nn.Module``, and re-exports."""
    for name in ('mmsoft.openmmlab.backbones.SOFT.init_weights',
                 'mmsoft.openmmlab.backbones.SOFT.forward_features',
                 'mmsoft.openmmlab.backbones.SOFT.state_dict',
                 'mmsoft.openmmlab.SOFT.freeze_stages',
                 'mmsoft.models.SOFT.forward_intermediates'):
        resolve(name, use_import=False)
    with pytest.raises(Unresolved, match="no 'forward_nothing'"):
        resolve('mmsoft.openmmlab.backbones.SOFT.forward_nothing', use_import=False)


def test_a_missing_dependency_falls_back_to_the_source(monkeypatch):
    """A module whose import needs an absent package is read instead; one
    whose import of mmsoft fails is broken."""
    import_module = importlib.import_module

    def missing(dependency):
        def fake_import(name, *args):
            if name == 'mmsoft.models.soft':
                raise ModuleNotFoundError(f'No module named {dependency!r}',
                                          name=dependency)
            return import_module(name, *args)
        return fake_import

    monkeypatch.setattr(importlib, 'import_module', missing('mmengine'))
    resolve('mmsoft.models.soft.SOFT.forward')
    with pytest.raises(Unresolved, match="defines no 'forward_nothing'"):
        resolve('mmsoft.models.soft.SOFT.forward_nothing')
    monkeypatch.setattr(importlib, 'import_module', missing('mmsoft.models.tracing'))
    with pytest.raises(Unresolved, match=r'import mmsoft.models.soft fails: '
                       r".*'mmsoft.models.tracing'"):
        resolve('mmsoft.models.soft.SOFT.forward')


def test_names_a_module_imports_on_first_use(tmp_path, monkeypatch):
    """A package's ``__getattr__`` that imports a name from one of its
    modules (whose import needs a package absent here): the name resolves
    when a module of the package defines it."""
    package = tmp_path / 'mmsoft' / 'lazy'
    package.mkdir(parents=True)
    (tmp_path / 'mmsoft' / '__init__.py').write_text('')
    (package / '__init__.py').write_text(
        "NAMES = ('build', 'gone')\n\n"
        'def __getattr__(name):\n'
        '    import importlib\n'
        "    return getattr(importlib.import_module(__name__ + '.heavy'), name)\n")
    (package / 'heavy.py').write_text('import not_installed_here\n\n'
                                      'def build():\n    pass\n')
    monkeypatch.setitem(globals(), 'REPO', str(tmp_path))  # the modules' root
    bindings.cache_clear()
    try:
        resolve('mmsoft.lazy.build', use_import=False)
        for missing in ('gone', 'other'):
            with pytest.raises(Unresolved, match=f"defines no '{missing}'"):
                resolve(f'mmsoft.lazy.{missing}', use_import=False)
    finally:
        bindings.cache_clear()


def test_a_glob_that_selects_nothing_raises():
    with pytest.raises(FileNotFoundError, match=r"pattern='doc/\*\*/\*.md' selects "
                       'no file'):
        _files(['README.md', 'doc/**/*.md'])
