"""Writes the model zoo's parameters and FLOPs from ``get_flops``'s count.

Every model of ``model-index.yml``'s metafiles is counted by
:func:`get_flops.count_config`; the tool rewrites its ``Parameters`` and
``FLOPs`` in the metafile and its figure cells in the collection's README,
and nothing else. A model built by several configs is counted once.
"""
import argparse
import json
import os.path as osp
import re
import sys
import time
import warnings
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

import yaml
from mmengine.config import Config

from get_flops import count_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COMMAND = 'python tools/analysis/update_metafiles.py'


class ZooModel(NamedTuple):
    """One model entry of a metafile."""
    name: str
    config: str  # relative to the repository root
    metafile: str
    readme: str
    parameters: Optional[int]  # as the metafile states them
    flops: Optional[int]


class Figures(NamedTuple):
    """What the tool writes for one model."""
    parameters: int
    backbone_parameters: int
    flops: int  # multiply-adds rounded to millions


def read_yaml(path: str, repo: str = REPO) -> dict:
    with open(osp.join(repo, path)) as file:
        return yaml.safe_load(file)


def zoo_models(repo: str = REPO) -> List[ZooModel]:
    """Every model that the metafiles of ``model-index.yml`` list."""
    models = []
    for metafile in read_yaml('model-index.yml', repo)['Import']:
        meta = read_yaml(metafile, repo)
        readmes = {c['Name']: c['README'] for c in meta['Collections']}
        for model in meta['Models']:
            metadata = model.get('Metadata', {})
            models.append(ZooModel(
                model['Name'], model['Config'], metafile,
                readmes[model['In Collection']], metadata.get('Parameters'),
                metadata.get('FLOPs')))
    return models


def round_flops(flops: int) -> int:
    """The metafiles' form of a count: multiply-adds rounded to millions."""
    return int(round(flops / 1e6)) * 10**6


def measure(configs: Iterable[str], repo: str = REPO,
            log: bool = False) -> Dict[str, Figures]:
    """Config path (relative to ``repo``) -> the figures of its model, each
    model counted once; with ``log``, each count and its time printed."""
    counted: Dict[str, Figures] = {}
    figures = {}
    for config in configs:
        cfg = Config.fromfile(osp.join(repo, config))
        # The model the config builds: equal for an ms-3x config and its 1x.
        key = json.dumps(dict(scope=cfg.get('default_scope'),
                              model=cfg.model.to_dict()), sort_keys=True, default=repr)
        start = time.perf_counter()
        if key not in counted:
            result = count_config(cfg)
            counted[key] = Figures(result['params'], result['backbone_params'],
                                   round_flops(result['flops']))
        figures[config] = counted[key]
        if log:
            print(f'{config}: {figures[config].parameters} parameters, '
                  f'{figures[config].flops / 1e9:.3f} GFLOPs '
                  f'({time.perf_counter() - start:.1f} s)', flush=True)
    return figures


def readme_cells(figures: Figures) -> Dict[str, str]:
    """README column header to the cell the tool writes."""
    return {'Params (ours)': f'{figures.parameters / 1e6:.2f}M',
            'Backbone params': f'{figures.backbone_parameters / 1e6:.2f}M',
            'GFLOPs*': f'{figures.flops / 1e9:.2f}'}


def rewrite_metafile(text: str, figures: Dict[str, Figures]) -> str:
    """``text`` of a metafile with the ``Parameters`` and ``FLOPs`` of the
    models named in ``figures`` replaced (ValueError where one lacks them)."""
    lines = text.split('\n')
    name, in_models, written = None, False, {}
    for index, line in enumerate(lines):
        in_models = in_models or line.startswith('Models:')
        match = re.match(r'  - Name: (\S+)$', line)
        if in_models and match:
            name = match[1]
        match = re.match(r'(\s+)(Parameters|FLOPs): \d+$', line)
        if in_models and match and name in figures:
            value = getattr(figures[name], match[2].lower())  # parameters, flops
            lines[index] = f'{match[1]}{match[2]}: {value}'
            written.setdefault(name, set()).add(match[2])
    for name in figures:
        if written.get(name) != {'Parameters', 'FLOPs'}:
            raise ValueError(f'{name} has no Parameters or FLOPs line to write')
    return '\n'.join(lines)


def table_rows(text: str, readme: str) -> Iterator[Tuple[int, str, Dict[str, str]]]:
    """The table rows of README ``text`` (at ``readme``, relative to the
    repository root) that link a config: line index, the config's path
    relative to the root, and column header -> cell."""
    header = None
    for index, line in enumerate(text.split('\n')):
        if not line.startswith('|'):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip()[1:-1].split('|')]
        if header is None:
            header = cells
            continue
        match = re.match(r'\[[^\]]*\]\(([^)]+\.py)\)$', cells[0])
        if match and len(cells) == len(header) == len(set(header)):
            config = osp.normpath(osp.join(osp.dirname(readme), match[1]))
            yield index, config, dict(zip(header, cells))


def rewrite_readme(text: str, readme: str, figures: Dict[str, Figures]) -> str:
    """``text`` of the README at ``readme`` with the figure cells of the rows
    that link a config of ``figures`` replaced (ValueError where a config has
    no row with every column of :func:`readme_cells`)."""
    lines = text.split('\n')
    found = set()
    for index, config, row in table_rows(text, readme):
        wanted = readme_cells(figures[config]) if config in figures else {}
        if not wanted or not set(wanted) <= set(row):
            continue
        found.add(config)
        if any(row[column] != value for column, value in wanted.items()):
            lines[index] = '| ' + ' | '.join({**row, **wanted}.values()) + ' |'
    missing = sorted(set(figures) - found)
    if missing:
        raise ValueError(f'{readme} has no table row with figure columns for '
                         f'{", ".join(missing)}')
    return '\n'.join(lines)


def update(models: List[ZooModel], figures: Dict[str, Figures], repo: str = REPO,
           write: bool = True) -> List[str]:
    """Brings the metafiles and READMEs of ``models`` to ``figures`` (config
    path -> figures) and returns the changed lines, as ``path:line: old ->
    new`` (without ``write``, only compares)."""
    by_file: Dict[str, Dict[str, Figures]] = {}
    for model in models:
        by_file.setdefault(model.metafile, {})[model.name] = figures[model.config]
        by_file.setdefault(model.readme, {})[model.config] = figures[model.config]
    changed = []
    for path, file_figures in by_file.items():
        with open(osp.join(repo, path)) as file:
            old = file.read()
        new = rewrite_metafile(old, file_figures) if path.endswith('.yml') else \
            rewrite_readme(old, path, file_figures)
        changed += [f'{path}:{number}: {before.strip()}  ->  {after.strip()}'
                    for number, (before, after) in
                    enumerate(zip(old.split('\n'), new.split('\n')), 1)
                    if before != after]
        if write and new != old:
            with open(osp.join(repo, path), 'w') as file:
                file.write(new)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--check', action='store_true',
                        help='write nothing; list the figures that differ from '
                        'the count and exit 1 if any')
    args = parser.parse_args(argv)
    # Each config's custom_imports would repeat it.
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
    models = zoo_models()
    start = time.perf_counter()
    figures = measure([model.config for model in models], log=True)
    print(f'Counted {len(models)} models in {time.perf_counter() - start:.0f} s')
    changed = update(models, figures, write=not args.check)
    print('\n'.join(changed) or 'Every figure matches the count.')
    if args.check and changed:
        print(f'{len(changed)} lines differ from the count; run {COMMAND}',
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
