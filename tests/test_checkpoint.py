"""mmsoft.checkpoint: unwrapping, prefixes, strict comparison, resize hook."""
import ast
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.checkpoint import (compare_state_dict, fit_state_dict,
                               grid_pos_embed_resizer, key_list, load_strictly,
                               select_prefix, split_prefix, strip_prefixes,
                               unwrap_state_dict)
from mmsoft.models.soft import resize_pos_embed
from mmsoft.checkpoint.strict import BN_COUNTER_KEYS


class Tiny(nn.Module):
    """A linear layer, a BatchNorm and 2x2 position embeddings after a
    class-token entry: (1, 1 + 4, 3)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
        self.pos = nn.Parameter(torch.zeros(1, 5, 3))


def tiny_state() -> dict:
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in Tiny().state_dict().items()}


# --------------------------------------------------------------- unwrap ---
@pytest.mark.parametrize('wrapper', ['state_dict', 'model'])
def test_unwrap_state_dict(wrapper):
    inner = {'a': torch.zeros(1)}
    state_dict, found = unwrap_state_dict({wrapper: inner, 'meta': {}})
    assert state_dict is inner and found == wrapper
    both = {'model': {'m': torch.zeros(1)}, 'state_dict': inner}
    assert unwrap_state_dict(both) == (inner, 'state_dict')  # state_dict first
    assert unwrap_state_dict(inner) == (inner, None)
    with pytest.raises(ValueError, match='must be a mapping.*got list'):
        unwrap_state_dict([inner])


def test_prefixes_are_stripped_and_selected():
    assert strip_prefixes({'module.backbone.fc.weight': 1, 'backbone.module.bn.w': 2,
                           'neck.backbone.x': 3}) == {'fc.weight': 1, 'bn.w': 2,
                                                      'neck.backbone.x': 3}
    assert strip_prefixes({'module.backbone.x': 1}, re.compile(r'^module\.')) == {
        'backbone.x': 1}
    assert list(strip_prefixes({'module.a': 1, 'b': 2})) == ['a', 'b']
    detector = {'module.backbone.fc.weight': 1, 'backbone.bn.bias': 2, 'neck.w': 3}
    assert split_prefix(detector, 'backbone') == ({'fc.weight': 1, 'bn.bias': 2},
                                                  ['neck.w'])
    assert select_prefix(detector, 'neck.') == {'w': 3}
    with pytest.raises(ValueError, match=r"no keys starting with 'head\.'"):
        select_prefix(detector, 'head.')


def test_key_list_counts_what_it_leaves_out():
    assert key_list(['c', 'a', 'b']) == 'a, b, c'
    assert key_list(['c', 'a', 'b'], limit=2) == 'a, b, ... (1 more)'
    assert key_list([]) == '-'


# ---------------------------------------------------- strict comparison ---
def test_fitting_state_dict_is_returned_as_is():
    state = tiny_state()
    result = compare_state_dict(state, Tiny().state_dict())
    assert result.fits() and result.describe() == ''
    assert all(result.fitted[k] is state[k] for k in state)


def test_missing_unexpected_and_mis_shaped_keys_are_listed():
    state = tiny_state()
    del state['fc.bias']
    state['fc.extra'] = torch.zeros(1)
    state['bn.weight'] = torch.zeros(5)
    result = compare_state_dict(state, Tiny().state_dict())
    assert result.missing == ['fc.bias']
    assert result.unexpected == ['fc.extra']
    assert result.mismatched == {'bn.weight': ((5, ), (2, ))}
    assert not result.fits() and not result.fits(allow_unexpected=True)
    assert result.describe() == ('missing keys: fc.bias; unexpected keys: fc.extra; '
                                 'shape mismatches: bn.weight: (5,) (expected (2,))')
    with pytest.raises(ValueError) as err:
        fit_state_dict(state, Tiny().state_dict(), context='x.pth does not fit Tiny')
    assert str(err.value) == 'x.pth does not fit Tiny: ' + result.describe() + '.'


def test_unexpected_keys_can_be_allowed():
    state = dict(tiny_state(), **{'head.fc.weight': torch.zeros(4)})
    result = fit_state_dict(state, Tiny().state_dict(), context='c',
                            allow_unexpected=True)
    assert result.unexpected == ['head.fc.weight'] and 'head.fc.weight' not in \
        result.fitted
    with pytest.raises(ValueError, match=r'^c: unexpected keys: head\.fc\.weight\.$'):
        fit_state_dict(state, Tiny().state_dict(), context='c')


def test_optional_keys_keep_the_model_values():
    model_state = Tiny().state_dict()
    state = tiny_state()
    del state['bn.num_batches_tracked'], state['fc.bias']
    result = fit_state_dict(state, model_state, context='c',
                            optional=re.compile(r'fc\.bias|' + BN_COUNTER_KEYS.pattern))
    assert result.optional_missing == ['bn.num_batches_tracked', 'fc.bias']
    assert result.fitted['fc.bias'] is model_state['fc.bias']
    with pytest.raises(ValueError, match=r'^c: missing keys: fc\.bias\.$'):
        fit_state_dict(state, model_state, context='c', optional=BN_COUNTER_KEYS)


def test_load_strictly_loads_and_names_the_model():
    model, state = Tiny(), tiny_state()
    del state['bn.num_batches_tracked']  # a counter, tolerated by default
    load_strictly(model, state, 'x.pth')
    assert torch.equal(model.fc.weight, state['fc.weight'])
    state['pos'] = torch.zeros(1, 4, 3)
    with pytest.raises(ValueError, match=r'^checkpoint x\.pth does not fit the Tiny '
                       r'backbone: shape mismatches: pos: \(1, 4, 3\) '
                       r'\(expected \(1, 5, 3\)\)\.$'):
        load_strictly(model, state, 'x.pth')


# ------------------------------------------------------------ resize hook ---
def test_pos_embed_hook_resizes_the_grid_and_keeps_the_extra_entry():
    model_state = Tiny().state_dict()  # pos: (1, 1 + 2*2, 3)
    state = tiny_state()
    gen = torch.Generator().manual_seed(1)
    state['pos'] = torch.randn(1, 1 + 4 * 4, 3, generator=gen)
    hook = grid_pos_embed_resizer({'pos': ((2, 2), 1)}, resize_pos_embed)
    result = fit_state_dict(state, model_state, context='c', resize=hook)
    assert result.resized == {'pos': ((1, 17, 3), (1, 5, 3))}
    # Independent reference: the 4x4 grid bilinearly interpolated to 2x2.
    grid = state['pos'][:, 1:].reshape(1, 4, 4, 3).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(2, 2), mode='bilinear',
                             align_corners=False).flatten(2).transpose(1, 2)
    fitted = result.fitted['pos']
    assert torch.equal(fitted[:, :1], state['pos'][:, :1])
    torch.testing.assert_close(fitted[:, 1:], expected)


@pytest.mark.parametrize('shape', [(1, 16, 3), (1, 17, 4), (2, 17, 3), (1, 11, 3)])
def test_pos_embed_hook_refuses_what_it_cannot_resize(shape):
    # No class-token entry, another width, a batch of two, no square grid.
    state = dict(tiny_state(), pos=torch.zeros(shape))
    hook = grid_pos_embed_resizer({'pos': ((2, 2), 1)}, resize_pos_embed)
    with pytest.raises(ValueError, match=r'shape mismatches: pos: '):
        fit_state_dict(state, Tiny().state_dict(), context='c', resize=hook)


def test_hook_ignores_other_keys():
    hook = grid_pos_embed_resizer({'pos': ((2, 2), 0)}, resize_pos_embed)
    assert hook('fc.weight', torch.zeros(4, 3), torch.zeros(2, 3)) is None


# ---------------------------------------------------------------- imports ---
PACKAGE_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def package_modules(package):
    """(dotted module name, path) of every module of ``package``.

    Raises:
        ValueError: When ``package`` is neither a module nor a package of
            the checkout.
    """
    root = osp.join(PACKAGE_ROOT, *package.split('.'))
    if osp.isfile(root + '.py'):  # a module
        yield package, root + '.py'
        return
    if not osp.isfile(osp.join(root, '__init__.py')):
        raise ValueError(f'package={package!r} is no module or package of the '
                         f'checkout ({PACKAGE_ROOT}); expected a dotted name '
                         "such as 'mmsoft.models' or 'mmsoft.models.soft'.")
    for folder, _, files in os.walk(root):
        for file in sorted(files):
            if file.endswith('.py'):
                path = osp.join(folder, file)
                parts = osp.relpath(path, PACKAGE_ROOT)[:-len('.py')].split(os.sep)
                yield '.'.join(parts[:-1] if file == '__init__.py' else parts), path


def imports_of(module, path):
    """(imported module name, line, inside a function) of every import of a
    module; ``from X import y`` yields both ``X`` and ``X.y``."""
    is_package = path.endswith('__init__.py')
    package = module.split('.') if is_package else module.split('.')[:-1]
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(inner) for inner in ast.walk(node)
                               if inner is not node)
    for node in ast.walk(tree):
        nested = id(node) in in_function
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, nested
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = '.'.join(base + ([node.module] if node.module else []))
            yield name, node.lineno, nested
            for alias in node.names:
                yield f'{name}.{alias.name}', node.lineno, nested


def in_package(name, package):
    return name == package or name.startswith(package + '.')


#: What ``mmsoft.models`` may import of mmsoft besides itself, at module level:
#: the utilities, the deprecated spellings, the official-key conversion
#: (``checkpoint_filter_fn``) and the export formulation's bottleneck cap.
MODELS_MAY_IMPORT = ('mmsoft.models', 'mmsoft.ops', 'mmsoft.utils',
                     'mmsoft.deprecations', 'mmsoft.checkpoint',
                     'mmsoft.deployment.traceable')


def test_models_import_only_what_they_need_at_module_level():
    for name in MODELS_MAY_IMPORT:  # raises for a name that moved
        assert list(package_modules(name)), name
    offences = [f'{module}:{line} imports {name}'
                for module, path in package_modules('mmsoft.models')
                for name, line, nested in imports_of(module, path)
                if name.startswith('mmsoft') and (nested or not any(
                    in_package(name, allowed) for allowed in MODELS_MAY_IMPORT))]
    assert not offences, offences


def test_checkpoint_code_imports_no_model():
    """Imports go one way: ``mmsoft.models`` imports ``mmsoft.checkpoint``."""
    imports = [(module, name, line)
               for module, path in package_modules('mmsoft.checkpoint')
               for name, line, _ in imports_of(module, path)]
    assert any(in_package(name, 'mmsoft.deprecations') for _, name, _ in imports)
    offences = [f'{module}:{line} imports {name}' for module, name, line in imports
                if in_package(name, 'mmsoft.models')]
    assert not offences, offences


#: Who may import whom: the operations import no model; what both models
#: share imports neither model; the models' files import one way:
#: ops <- common <- soft, ufo_vit.
FORBIDDEN_MODEL_IMPORTS = {
    'mmsoft.ops': ('mmsoft.models', ),
    'mmsoft.models.common': ('mmsoft.models.soft', 'mmsoft.models.ufo_vit'),
    'mmsoft.models.soft': ('mmsoft.models.ufo_vit', ),
    'mmsoft.models.ufo_vit': ('mmsoft.models.soft', ),
}


def test_models_depend_one_way():
    for package, forbidden in FORBIDDEN_MODEL_IMPORTS.items():
        for name in (package, *forbidden):  # raises for a name that moved
            assert list(package_modules(name)), name
    offences = [f'{module}:{line} imports {name}'
                for package, forbidden in FORBIDDEN_MODEL_IMPORTS.items()
                for module, path in package_modules(package)
                for name, line, _ in imports_of(module, path)
                if any(in_package(name, other) for other in forbidden)]
    assert not offences, offences
    # The scan sees the models' imports of the shared layers.
    assert any(in_package(name, 'mmsoft.models.common')
               for module, path in package_modules('mmsoft.models.soft')
               for name, _, _ in imports_of(module, path))


@pytest.mark.parametrize('package', ['mmsoft.models.backbones',
                                     'mmsoft.models.layers.shared'])
def test_scanning_a_package_that_does_not_exist_raises(package):
    with pytest.raises(ValueError, match=f"package='{package}' is no module or "
                       'package of the checkout'):
        list(package_modules(package))


def test_import_scan_resolves_relative_and_function_level_imports(tmp_path):
    path = tmp_path / 'soft.py'
    path.write_text('from ...checkpoint import load\n'
                    'def f():\n'
                    '    from ..ops import x\n'
                    '    import mmsoft.checkpoint.strict\n')
    found = set(imports_of('mmsoft.models.backbones.soft', str(path)))
    assert {('mmsoft.checkpoint', 1, False), ('mmsoft.checkpoint.load', 1, False),
            ('mmsoft.models.ops.x', 3, True),
            ('mmsoft.checkpoint.strict', 4, True)} <= found
    init = tmp_path / '__init__.py'
    init.write_text('from .strict import fit\n')
    assert ('mmsoft.checkpoint.strict', 1, False) in set(
        imports_of('mmsoft.checkpoint', str(init)))


def test_import_mmsoft_needs_only_torch():
    # Every framework made unimportable: the package imports and trains SOFT++.
    code = ('import sys\n'
            'for name in ("mmengine", "mmcv", "mmdet", "mmseg", "mmpretrain",\n'
            '             "timm", "transformers", "torchvision"):\n'
            '    sys.modules[name] = None\n'
            'import torch, mmsoft\n'
            'model = mmsoft.SOFT(arch="tiny", variant="soft++", num_classes=10)\n'
            'loss = model(torch.randn(2, 3, 64, 64)).sum()\n'
            'loss.backward()\n'
            'maps = model.forward_intermediates(torch.randn(1, 3, 64, 96),\n'
            '                                   intermediates_only=True)\n'
            'print([tuple(m.shape) for m in maps])\n'
            'print(sorted(n for n in sys.modules if n.split(".")[0] in\n'
            '             ("mmengine", "mmcv", "timm") and sys.modules[n]))\n')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split('\n')[:2] == [
        '[(1, 64, 16, 24), (1, 128, 8, 12), (1, 320, 4, 6), (1, 512, 2, 3)]', '[]']
