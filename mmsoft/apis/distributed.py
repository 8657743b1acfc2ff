"""Launching: the ``--launcher`` options, and distributed runs without CUDA."""
import argparse
import os
from typing import List, Optional

from mmengine.config import Config
from mmengine.logging import print_log

#: Name of mmengine's DDP wrapper registered for CPU modules.
CPU_DDP_TYPE = 'CPUDistributedDataParallel'


def parse_with_launcher(parser: argparse.ArgumentParser,
                        argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Adds ``--launcher``/``--local-rank``, parses, and exports ``LOCAL_RANK``.

    Shared by ``tools/train.py`` and ``tools/test.py``; torchrun sets
    ``LOCAL_RANK`` itself, the older ``torch.distributed.launch`` passes
    ``--local-rank``.
    """
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def setup_cpu_distributed(cfg: Config) -> None:
    """Prepares a distributed run on a machine without CUDA (e.g. gloo).

    mmengine 0.10's ``pytorch`` launcher calls ``torch.cuda.set_device`` and
    wraps the model in ``DistributedDataParallel`` with ``device_ids``; both
    fail on a CPU-only torch. Here the process group is initialised from
    torchrun's environment (mmengine then skips its own initialisation) and
    the model is wrapped without device ids. Nothing is done with CUDA or
    with ``cfg.launcher == 'none'``.

    Raises:
        RuntimeError: A launcher other than ``pytorch`` without CUDA.
    """
    import torch
    import torch.distributed as torch_dist
    if cfg.launcher == 'none' or torch.cuda.is_available():
        return
    if cfg.launcher != 'pytorch':
        raise RuntimeError(f'--launcher {cfg.launcher} needs CUDA devices; on CPU '
                           f'use torchrun (tools/dist_train.sh, --launcher pytorch)')
    dist_cfg = dict((cfg.get('env_cfg') or {}).get('dist_cfg') or {})
    backend = dist_cfg.pop('backend', 'gloo')
    if backend != 'gloo':
        print_log(f"no CUDA: the gloo backend instead of the config's '{backend}'",
                  logger='current')
        backend = 'gloo'
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(backend=backend, **dist_cfg)
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    if wrapper.get('type', 'MMDistributedDataParallel') == \
            'MMDistributedDataParallel':
        wrapper['type'] = register_cpu_ddp()
        wrapper.setdefault('broadcast_buffers', False)
        wrapper.setdefault('find_unused_parameters',
                           cfg.get('find_unused_parameters', False))
        cfg.model_wrapper_cfg = wrapper


def register_cpu_ddp() -> str:
    """Registers (once) and names mmengine's DDP wrapper without device ids."""
    from mmengine.model import MMDistributedDataParallel
    from mmengine.registry import MODEL_WRAPPERS
    if MODEL_WRAPPERS.get(CPU_DDP_TYPE) is None:

        class CPUDistributedDataParallel(MMDistributedDataParallel):
            """``MMDistributedDataParallel`` for CPU modules (no device ids)."""

            def __init__(self, module, device_ids=None, **kwargs):
                super().__init__(module=module, device_ids=None, **kwargs)

        MODEL_WRAPPERS.register_module(name=CPU_DDP_TYPE,
                                       module=CPUDistributedDataParallel)
    return CPU_DDP_TYPE
