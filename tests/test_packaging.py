"""What the installed package exposes to OpenMMLab tooling."""
import ast
import configparser
import glob
import os
import os.path as osp
import re

import yaml

import mmsoft

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MIM_DIR = osp.join(osp.dirname(mmsoft.__file__), '.mim')


def test_mim_index_lists_existing_configs():
    with open(osp.join(MIM_DIR, 'model-index.yml')) as file:
        index = yaml.safe_load(file)
    configs = []
    for metafile in index['Import']:
        with open(osp.join(MIM_DIR, metafile)) as file:
            configs += [model['Config'] for model in yaml.safe_load(file)['Models']]
    assert len(configs) == 20
    assert all(osp.isfile(osp.join(MIM_DIR, path)) for path in configs)


def test_imported_package_is_the_checkout():
    """An editable install imports the working tree's files (in .venv through
    the link that lets mim find the package, see tools/install.sh)."""
    assert osp.realpath(osp.dirname(mmsoft.__file__)) == osp.join(
        osp.realpath(REPO), 'mmsoft')


# Lab code (cost analysis, the benchmark and its runner, the comparison) lives in
# tools/analysis/mmsoft_analysis, outside the installed package.
LAB_NAME = re.compile(r'analysis|benchmark|comparison|op_profile|gpu_node')
# Top-level packages of the checkout that the installed package lacks, and
# their folders.
CHECKOUT_ONLY = {'mmsoft_analysis': 'tools/analysis/mmsoft_analysis',
                 'tools': 'tools', 'configs': 'configs'}


def unselected_alternatives(pattern: re.Pattern, paths) -> list:
    """The ``|`` alternatives of ``pattern`` that match none of ``paths``."""
    return [alt for alt in pattern.pattern.split('|')
            if not any(re.search(alt, path) for path in paths)]


def test_lab_names_select_the_lab_code():
    """Each alternative of LAB_NAME names lab code that exists, and each
    CHECKOUT_ONLY package is a folder of the checkout."""
    lab = [osp.relpath(path, REPO) for path in glob.glob(
        osp.join(REPO, 'tools', '**', '*.py'), recursive=True)]
    assert unselected_alternatives(LAB_NAME, lab) == []
    assert unselected_alternatives(re.compile(LAB_NAME.pattern + '|profiler'),
                                   lab) == ['profiler']
    assert [folder for folder in CHECKOUT_ONLY.values()
            if not osp.isdir(osp.join(REPO, folder))] == []


def _library_modules():
    """``(path relative to the repository, parsed module)`` of every Python file
    of the package (not the ``.mim`` links to configs and tools)."""
    root = osp.join(REPO, 'mmsoft')
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name != '.mim']
        for name in files:
            if name.endswith('.py'):
                path = osp.join(folder, name)
                with open(path) as file:
                    yield osp.relpath(path, REPO), ast.parse(file.read())


def _own_imports(tree: ast.Module):
    """The modules a module imports from mmsoft itself (relative imports with
    their dots) or from outside every installed library (``mmsoft_analysis``,
    ``tools``, ``configs``), at any level of the code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = '.' * node.level + (node.module or '')
            prefix = module if module.endswith('.') else module + '.'
            names = [module] + [prefix + alias.name for alias in node.names]
        else:
            continue
        for name in names:
            top = name.lstrip('.').split('.')[0]
            if name.startswith('.') or top in ('mmsoft', *CHECKOUT_ONLY):
                yield name


def test_package_holds_no_lab_code():
    """No module of the package is, or imports, cost-analysis, benchmark,
    GPU-check or comparison code."""
    modules = dict(_library_modules())
    assert 'mmsoft/__init__.py' in modules
    named = [path for path in modules if LAB_NAME.search(path)]
    assert not named, f'lab modules inside mmsoft/: {named}'
    imports = {}
    for path, tree in modules.items():
        lab = [name for name in _own_imports(tree)
               if LAB_NAME.search(name) or name.split('.')[0] in CHECKOUT_ONLY]
        if lab:
            imports[path] = lab
    assert not imports, f'mmsoft imports lab code: {imports}'


def _pinned_torch(requirements: str) -> str:
    """The ``torch==X`` version a requirements file pins."""
    with open(osp.join(REPO, 'requirements', requirements)) as file:
        pins = re.findall(r'^torch==([\d.]+)$', file.read(), re.MULTILINE)
    assert len(pins) == 1, (requirements, pins)
    return pins[0]


def test_supported_torch_range_is_the_tested_one():
    """setup.cfg's floor, the README and the test environments of both ends
    name one range; setup.cfg sets no ceiling (installing mmsoft never swaps
    a user's newer torch). The stack's torch lies inside it."""
    from mmsoft.utils.torch_compat import SUPPORTED_TORCH, torch_version
    floor, ceiling = SUPPORTED_TORCH
    assert torch_version(_pinned_torch('floor.txt')) == floor  # make test-floor
    assert torch_version(_pinned_torch('newest.txt')) == ceiling  # make test-newest
    # make test-stack
    assert floor <= torch_version(_pinned_torch('build.txt')) <= ceiling
    config = configparser.ConfigParser()
    config.read(osp.join(REPO, 'setup.cfg'))
    requires = config['options']['install_requires'].split()
    assert f'torch>={floor[0]}.{floor[1]}' in requires
    assert not any(r.startswith('torch') and '<' in r for r in requires), requires
    with open(osp.join(REPO, 'README.md')) as file:
        assert (f'**PyTorch {floor[0]}.{floor[1]} to {ceiling[0]}.{ceiling[1]}**'
                in file.read())


def test_untested_torch_warns_once_and_tested_ones_do_not():
    import warnings

    from mmsoft.utils.torch_compat import (SUPPORTED_TORCH, UntestedTorchWarning,
                                           warn_if_untested_torch)
    floor, ceiling = SUPPORTED_TORCH
    for inside in (f'{floor[0]}.{floor[1]}.2', f'{ceiling[0]}.{ceiling[1]}.1+cu130'):
        assert not warn_if_untested_torch(inside)
    newer = f'{ceiling[0]}.{ceiling[1] + 1}.0'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('default')  # Python's own rule: once per line
        for _ in range(3):
            warn_if_untested_torch(newer)
    assert len(caught) == 1
    assert caught[0].category is UntestedTorchWarning
    assert newer in str(caught[0].message)
    assert f'{ceiling[0]}.{ceiling[1]}' in str(caught[0].message)
    with warnings.catch_warnings(record=True):
        assert warn_if_untested_torch('2.0.1')


def test_classifiers_name_the_pythons_the_environments_run():
    """setup.cfg's Python classifiers are the versions `make test` runs: 3.11
    (stack and floor) and 3.12 (newest, tools/install.sh)."""
    config = configparser.ConfigParser()
    config.read(osp.join(REPO, 'setup.cfg'))
    declared = set(re.findall(r'Programming Language :: Python :: (3\.\d+)',
                              config['metadata']['classifiers']))
    with open(osp.join(REPO, 'tools', 'install.sh')) as file:
        newest = re.search(r'^NEWEST_PYTHON=(3\.\d+)$', file.read(), re.MULTILINE)[1]
    assert declared == {'3.11', newest}


def test_makefile_marker_expressions_name_registered_markers_in_use():
    """Each suite's marker expression (Makefile) names only markers that
    setup.cfg registers and that some test of tests/ carries: a misspelt or
    unused marker would change what a suite selects without a word."""
    with open(osp.join(REPO, 'Makefile')) as file:
        makefile = file.read()
    expressions = dict(re.findall(r'^(\w+_MARKERS) \?= (.+)$', makefile, re.MULTILINE))
    assert set(expressions) == {'STACK_MARKERS', 'FLOOR_MARKERS', 'NEWEST_MARKERS'}
    config = configparser.ConfigParser()
    config.read(osp.join(REPO, 'setup.cfg'))
    registered = {line.split(':')[0].split('(')[0].strip()
                  for line in config['tool:pytest']['markers'].strip().splitlines()}
    sources = ''
    for root, _, files in os.walk(osp.join(REPO, 'tests')):
        for name in files:
            if name.endswith('.py'):
                with open(osp.join(root, name)) as file:
                    sources += file.read()
    for variable, expression in expressions.items():
        names = set(re.findall(r'\w+', expression)) - {'and', 'or', 'not'}
        assert names, (variable, expression)
        assert names <= registered, f'{variable}: {names - registered} not in setup.cfg'
        for name in names:
            assert f'mark.{name}' in sources, f'{variable}: no test is marked {name}'


#: The section titles of the Apache License 2.0's terms, in order.
APACHE_SECTIONS = ('Definitions', 'Grant of Copyright License',
                   'Grant of Patent License', 'Redistribution',
                   'Submission of Contributions', 'Trademarks',
                   'Disclaimer of Warranty', 'Limitation of Liability',
                   'Accepting Warranty or Additional Liability')


def test_license_file_is_the_license_setup_cfg_names():
    """setup.cfg's ``license`` is Apache-2.0, its ``license_files`` is
    LICENSE, and LICENSE holds that license's whole text."""
    config = configparser.ConfigParser()
    config.read(osp.join(REPO, 'setup.cfg'))
    metadata = config['metadata']
    assert metadata['license'] == 'Apache-2.0'
    assert metadata['license_files'].split() == ['LICENSE']
    with open(osp.join(REPO, 'LICENSE')) as file:
        text = file.read()
    assert re.match(r'\s*Apache License\s+Version 2\.0, January 2004\s', text)
    titles = re.findall(r'^\s+(\d)\. ([A-Z][\w ]+?)\.', text, re.MULTILINE)
    assert titles == [(str(i), title) for i, title in
                      enumerate(APACHE_SECTIONS, 1)], titles
    assert 'END OF TERMS AND CONDITIONS' in text
    assert len(text.split()) > 1500  # the whole text, not a notice


def test_changelog_starts_with_what_comes_next():
    """CHANGELOG.md's first section is the coming release or the version the
    package declares."""
    with open(osp.join(REPO, 'CHANGELOG.md')) as file:
        headings = re.findall(r'^## (.+)$', file.read(), re.MULTILINE)
    assert headings and headings[0] in ('Unreleased', mmsoft.__version__), headings
