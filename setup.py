"""Build script; the package metadata lives in setup.cfg.

Besides the package, it exposes ``configs/``, ``tools/`` and
``model-index.yml`` under ``mmsoft/.mim`` (links in an editable install,
copies in a wheel), where OpenMMLab's ``mim`` looks for a package's model
index and configs.
"""
import os
import os.path as osp
import shutil
import sys

from setuptools import setup

MIM_FILES = ('configs', 'tools', 'model-index.yml')


def add_mim_extension():
    """Links (editable install) or copies (wheel) MIM_FILES into mmsoft/.mim."""
    editable = any(arg in sys.argv for arg in ('develop', 'editable_wheel'))
    if not any(arg in sys.argv for arg in ('develop', 'editable_wheel',
                                           'bdist_wheel', 'sdist', 'build')):
        return
    root = osp.dirname(osp.abspath(__file__))
    mim_dir = osp.join(root, 'mmsoft', '.mim')
    os.makedirs(mim_dir, exist_ok=True)
    for name in MIM_FILES:
        src, dst = osp.join(root, name), osp.join(mim_dir, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if not osp.exists(src):
            continue
        if editable:
            os.symlink(osp.relpath(src, mim_dir), dst)
        elif osp.isdir(src):  # bytecode that running the tools wrote stays out
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copyfile(src, dst)


add_mim_extension()
setup(package_data={'mmsoft': ['.mim/model-index.yml', '.mim/configs/**/*',
                               '.mim/tools/**/*']},
      include_package_data=True)
