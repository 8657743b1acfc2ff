"""What importing mmsoft adds to OpenMMLab's registries.

mmengine's root registries are the fallback of every OpenMMLab library: a
name that a library's own scope lacks is looked up there. So mmsoft adds only
its own modules to them, under names that no library registers, and the
pre-training head goes into mmpretrain's registry.
"""
import pytest

pytest.importorskip('mmengine', reason='needs OpenMMLab (mmengine): runs in the '
                    'stack and floor environments')

import json
import subprocess
import sys

pytestmark = pytest.mark.openmmlab


# Everything mmsoft adds to mmengine's root registries, registry by registry.
ROOT_ADDITIONS = {
    'MODELS': ['SOFT', 'UFOViT', 'ValidRegionDetDataPreprocessor',
               'ValidRegionSegDataPreprocessor'],
}
# ... and to mmpretrain's (``import mmsoft.pretrain``).
MMPRETRAIN_ADDITIONS = {
    'MODELS': ['UFOViTClassAttentionHead', 'UFOViTStride16'],
}
# The DDP wrapper for CPU modules, registered when a distributed run on CPU
# builds it (mmsoft.apis.building.register_cpu_ddp).
CPU_DDP_ADDITIONS = {'MODEL_WRAPPERS': ['CPUDistributedDataParallel']}

_LIST_OURS = r'''
import importlib, json, sys
import mmengine.registry


def ours(registry_module, scope):
    # {registry: sorted names of the entries defined in mmsoft}, over the
    # registries of the library (mmpretrain.registry also holds aliases of
    # mmengine's, e.g. MMENGINE_MODELS)
    found = {}
    for name, registry in vars(registry_module).items():
        if isinstance(registry, mmengine.registry.Registry) and \
                registry.scope == scope:
            names = sorted(key for key, obj in registry.module_dict.items()
                           if obj.__module__.split('.')[0] == 'mmsoft')
            if names:
                found[name] = names
    return found


for module in sys.argv[2:]:
    if module == 'cpu_ddp':
        from mmsoft.apis import register_cpu_ddp
        register_cpu_ddp()
    else:
        importlib.import_module(module)
print(json.dumps(ours(importlib.import_module(sys.argv[1]),
                      sys.argv[1].split('.')[0])))
'''


def mmsoft_entries(registries, *imports):
    '''What the registries of the module ``registries`` (e.g.
    ``'mmengine.registry'``) hold from mmsoft after ``imports``, in a fresh
    interpreter: ``{registry: [names]}``.'''
    done = subprocess.run([sys.executable, '-c', _LIST_OURS, registries, *imports],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_names(registry_module, registry):
    '''Names in one registry of a library (its modules imported).'''
    return set(getattr(registry_module, registry).module_dict)


def test_import_mmsoft_adds_only_its_backbones_and_preprocessors():
    assert mmsoft_entries('mmengine.registry', 'mmsoft') == ROOT_ADDITIONS
    assert mmsoft_entries('mmengine.registry', 'mmsoft', 'cpu_ddp') == {
        **ROOT_ADDITIONS, **CPU_DDP_ADDITIONS}


@pytest.mark.mmcv_ops
def test_no_library_registers_mmsoft_names():
    """mmdet and mmseg register none of the names mmsoft adds to the root."""
    from mmdet import registry as mmdet_registry
    from mmdet.utils import register_all_modules as register_mmdet
    from mmseg import registry as mmseg_registry
    from mmseg.utils import register_all_modules as register_mmseg
    register_mmdet(init_default_scope=False)
    register_mmseg(init_default_scope=False)
    for registry, names in {**ROOT_ADDITIONS, **CPU_DDP_ADDITIONS}.items():
        for library in (mmdet_registry, mmseg_registry):
            assert not set(names) & library_names(library, registry), library


@pytest.mark.torchvision
def test_pretrain_registers_in_mmpretrain_only():
    assert mmsoft_entries('mmengine.registry', 'mmsoft', 'mmsoft.pretrain') == \
        ROOT_ADDITIONS
    assert mmsoft_entries('mmpretrain.registry', 'mmsoft', 'mmsoft.pretrain') == \
        MMPRETRAIN_ADDITIONS
    from mmpretrain import registry as mmpretrain_registry
    from mmpretrain.utils import register_all_modules as register_mmpretrain
    register_mmpretrain(init_default_scope=False)
    for registry, names in {**ROOT_ADDITIONS, **CPU_DDP_ADDITIONS}.items():
        assert not set(names) & library_names(mmpretrain_registry, registry)
