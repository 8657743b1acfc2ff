"""The accuracy-against-cost table and plots of ``tools/analysis/compare_backbones.py``.

:func:`comparison_rows` joins each backbone's training runs (one
``result.json`` per seed, see :mod:`mmsoft_analysis.comparison`) with its
cost measurements (``tools/analysis/benchmark.py``'s ``results.json`` of the
inference and the training run); :func:`write_report` writes them as
``table.md``, ``comparison.json`` and two plots.
"""
import json
import os
from typing import Dict, List, Optional, Sequence

from .comparison import (BBOX_METRIC, MIOU_METRIC, RECIPES, SEGM_METRIC, Entry,
                         seed_summary)

MIB = 2**20
# The benchmark spec suffix of mmsoft's backbones without the memory-efficient
# path (compare_backbones.py measures them both ways).
PLAIN = ':memory_efficient=False'


def _by_model(records: Sequence[Dict]) -> Dict[str, Dict]:
    return {record['model']: record for record in records if 'error' not in record}


def cost_fields(entry: Entry, costs: Optional[Dict]) -> Dict:
    """The cost columns of ``entry``'s backbone (None where not measured).

    Args:
        entry (Entry): A detector entry (its config is the benchmark spec).
        costs (dict, optional): ``inference`` and ``train``: the two
            benchmark runs' ``results.json``.

    Returns:
        dict: ``params_m``, ``gflops`` (800x1333), ``gflops_small`` (the
        training size, 160x160), ``latency_s`` (inference at 800x1333,
        fastest CPU seconds), ``train_iter_s`` (forward and backward at
        800x1333, fastest CPU seconds) and ``train_peak_mib`` (live peak of
        training at 1536x1536); the last two again as ``*_plain``: mmsoft's
        backbones with ``memory_efficient=False``, the peers' own figures
        (plain autograd is their only path).
    """
    fields = dict(params_m=None, gflops=None, gflops_small=None, latency_s=None,
                  train_iter_s=None, train_peak_mib=None, train_iter_s_plain=None,
                  train_peak_mib_plain=None)
    if not costs:
        return fields
    inference = _by_model(costs['inference']['results']).get(entry.config, {})
    small = _by_model(costs.get('flops', {}).get('results', [])).get(entry.config, {})
    if 'params' in inference:
        fields['params_m'] = inference['params'] / 1e6
    fields['gflops'] = inference.get('gflops')
    fields['gflops_small'] = small.get('gflops')
    fields['latency_s'] = inference.get('cpu_seconds')
    trainings = _by_model(costs['train']['results'])
    peaks = _by_model(costs['train']['peaks'])
    plain = entry.config + PLAIN if entry.ours else entry.config
    for suffix, spec in (('', entry.config), ('_plain', plain)):
        training, peak = trainings.get(spec, {}), peaks.get(spec, {})
        fields['train_iter_s' + suffix] = training.get('cpu_seconds')
        if 'peak_bytes' in peak:
            fields['train_peak_mib' + suffix] = peak['peak_bytes'] / MIB
    return fields


def metric_fields(entry: Entry, runs: Sequence[Dict], task: str,
                  metrics: Sequence[str]) -> Dict:
    """Each metric's :func:`~.comparison.seed_summary` over ``entry``'s
    finished runs of ``task``, with the seeds and the mean training time."""
    mine = sorted((run for run in runs if run['task'] == task
                   and run['config'] == entry.config
                   and run.get('recipe', 'shared') == entry.recipe),
                  key=lambda run: run['seed'])
    fields = dict(seeds=[run['seed'] for run in mine])
    for metric in metrics:
        values = [run['metrics'][metric] for run in mine]
        fields[metric] = seed_summary(values) if values else None
    if mine:
        fields['train_minutes'] = sum(run['wall_seconds'] for run in mine) / len(
            mine) / 60
    return fields


def comparison_rows(runs: Sequence[Dict], costs: Optional[Dict],
                    detectors: Sequence[Entry],
                    segmentors: Sequence[Entry]) -> Dict[str, List[Dict]]:
    """One row per detector (costs and mAPs) and per segmentor (mIoU)."""
    detection = [dict(name=entry.name, config=entry.config, source=entry.source,
                      group=entry.group, ours=entry.ours, recipe=entry.recipe,
                      **cost_fields(entry, costs),
                      **metric_fields(entry, runs, 'detection',
                                      (BBOX_METRIC, SEGM_METRIC)))
                 for entry in detectors]
    segmentation = [dict(name=entry.name, config=entry.config, source=entry.source,
                         group=entry.group, ours=entry.ours,
                         **metric_fields(entry, runs, 'segmentation',
                                         (MIOU_METRIC, )))
                    for entry in segmentors]
    return dict(detection=detection, segmentation=segmentation)


def _number(value: Optional[float], digits: int) -> str:
    return '–' if value is None else f'{value:,.{digits}f}'


def _metric(summary: Optional[Dict], scale: float = 1.0) -> str:
    """``mean (v1, v2)``, or ``not run``."""
    if summary is None:
        return 'not run'
    values = ', '.join(f'{v * scale:.3f}' for v in summary['values'])
    return f"**{summary['mean'] * scale:.3f}** ({values})"


def _sizes(settings: Dict) -> Dict[str, str]:
    """The measurement sizes, as ``'800×1333'``."""
    return {kind: size.replace('x', '×') for kind, size in settings['sizes'].items()}


def _number_text(value: float) -> str:
    """``0.0003`` -> ``'3e-4'``."""
    mantissa, exponent = f'{value:e}'.split('e')
    return f'{float(mantissa):g}e{int(exponent)}'


def _recipe(name: str) -> str:
    """A recipe in words: ``shared (lr 1e-3, warm-up 1/6 of the run)`` or
    ``lr 3e-4, warm-up 1 epoch``."""
    recipe = RECIPES[name]
    lr = 'lr 1e-3' if recipe.lr is None else f'lr {_number_text(recipe.lr)}'
    if recipe.warmup_epochs is None:
        return f'{name} ({lr}, warm-up 1/6 of the run)'
    return f'{lr}, warm-up {recipe.warmup_epochs:g} epoch'


def markdown_tables(rows: Dict[str, List[Dict]], settings: Dict) -> str:
    """The detection and segmentation tables, with the settings they come from."""
    machine, sizes = settings['machine'], _sizes(settings)
    lines = [
        f"Demo data, the demo schedules compressed to {settings['epochs']} "
        f"epochs (Mask R-CNN) and {settings['seg_iters']} iterations (UperNet); "
        f"seeds {', '.join(map(str, settings['seeds']))}; {settings['threads']} "
        f"thread per run; {machine['processor']}, {machine['cpu_count']} cores, "
        f"torch {machine['torch']}, report of {machine['date']}. Each run's "
        "date and wall time are in runs.json; training (min) is the mean over "
        "the seeds, under the load of the run's day, and a run resumed from "
        "the probe counts its epochs after the first. Training costs of "
        "mmsoft's backbones with the memory-efficient path and without it "
        "(plain autograd, as the peers run); the peers' figures repeat in "
        "both.", '',
        f"| backbone | source | group | recipe | config | params (M) | GFLOPs "
        f"{sizes['flops']} | GFLOPs {sizes['inference']} | inference "
        f"{sizes['inference']} (CPU s) | training iteration {sizes['train']} "
        f"(CPU s) | same, plain autograd | training peak {sizes['peak']} (MiB) | "
        'same, plain autograd | bbox mAP | segm mAP | training (min) |',
        '|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|']
    for row in rows['detection']:
        lines.append(
            f"| {row['name']} | {row['source']} | {row['group']} | "
            f"{_recipe(row['recipe'])} | "
            f"[{os.path.basename(row['config'])}](../../{row['config']}) | "
            f"{_number(row['params_m'], 1)} | {_number(row['gflops_small'], 2)} | "
            f"{_number(row['gflops'], 1)} | {_number(row['latency_s'], 2)} | "
            f"{_number(row['train_iter_s'], 2)} | "
            f"{_number(row['train_iter_s_plain'], 2)} | "
            f"{_number(row['train_peak_mib'], 0)} | "
            f"{_number(row['train_peak_mib_plain'], 0)} | "
            f"{_metric(row[BBOX_METRIC])} | {_metric(row[SEGM_METRIC])} | "
            f"{_number(row.get('train_minutes'), 1)} |")
    lines += ['', '| backbone | source | config | mIoU (%) | training (min) |',
              '|---|---|---|---|---:|']
    for row in rows['segmentation']:
        lines.append(
            f"| {row['name']} | {row['source']} | "
            f"[{os.path.basename(row['config'])}](../../{row['config']}) | "
            f"{_metric(row[MIOU_METRIC])} | {_number(row.get('train_minutes'), 1)} |")
    return '\n'.join(lines) + '\n'


def probe_table(probes: Sequence[Dict], runs: Sequence[Dict]) -> str:
    """The probe: each backbone's first epoch of the compressed schedule under
    each recipe (bbox and segm mAP and the training loss there), with the
    full run of the same recipe and seed where there is one."""
    full = {(run['config'], run.get('recipe', 'shared'), run['seed']): run
            for run in runs if run['task'] == 'detection'}
    lines = ['| backbone | recipe | bbox mAP, epoch 1 | segm mAP, epoch 1 | '
             'training loss, last 40% of epoch 1 | bbox mAP, full run | '
             'segm mAP, full run | minutes, epoch 1 |',
             '|---|---|---:|---:|---:|---:|---:|---:|']
    for run in probes:
        if run['task'] != 'probe':
            continue
        whole = full.get((run['config'], run['recipe'], run['seed']), {})
        final = whole.get('metrics', {})
        lines.append(
            f"| {run['name']} | {_recipe(run['recipe'])} | "
            f"{run['metrics'][BBOX_METRIC]:.3f} | {run['metrics'][SEGM_METRIC]:.3f} | "
            f"{_number(run.get('loss'), 3)} | {_number(final.get(BBOX_METRIC), 3)} | "
            f"{_number(final.get(SEGM_METRIC), 3)} | {run['wall_seconds'] / 60:.1f} |")
    return '\n'.join(lines) + '\n'


def plot_map_against(rows: Sequence[Dict], cost: str, label: str, path: str,
                     ours_also: Optional[str] = None) -> None:
    """bbox mAP (mean, the seeds' range as error bars) against one cost
    column, one point per backbone; mmsoft's backbones in red, with their
    ``ours_also`` column (another implementation's cost) as a hollow marker
    joined to the first."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        summary = row[BBOX_METRIC]
        if summary is None or row[cost] is None:
            continue
        errors = [[summary['mean'] - summary['low']],
                  [summary['high'] - summary['mean']]]
        colour, marker = ('tab:red', 'o') if row['ours'] else ('tab:blue', 's')
        axes.errorbar(row[cost], summary['mean'], yerr=errors, fmt=marker,
                      color=colour, capsize=3)
        axes.annotate(row['name'], (row[cost], summary['mean']), fontsize=7,
                      xytext=(4, 3), textcoords='offset points')
        if row['ours'] and ours_also and row.get(ours_also) is not None:
            axes.plot([row[cost], row[ours_also]], [summary['mean']] * 2, ':',
                      color=colour)
            axes.plot(row[ours_also], summary['mean'], marker, mfc='none',
                      color=colour)
    axes.margins(x=0.15)  # room for the labels of the outermost points
    axes.set_xlabel(label)
    axes.set_ylabel('bbox mAP (demo data; bars: range over seeds)')
    axes.set_title('mmsoft (red) and the libraries\' backbones (blue)')
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(runs: Sequence[Dict], probes: Sequence[Dict],
                 costs: Optional[Dict], detectors: Sequence[Entry],
                 segmentors: Sequence[Entry], settings: Dict,
                 out_dir: str) -> List[str]:
    """Writes ``table.md``, ``probe.md``, ``comparison.json``,
    ``map_vs_latency.png`` and ``map_vs_train_memory.png`` in ``out_dir``.

    Args:
        runs (Sequence[dict]): The finished runs' ``result.json`` contents.
        probes (Sequence[dict]): The finished probe runs' results.
        costs (dict, optional): The benchmark results (see
            :func:`cost_fields`); None leaves the cost columns empty.
        detectors (Sequence[Entry]): Mask R-CNN rows, in order.
        segmentors (Sequence[Entry]): UperNet rows, in order.
        settings (dict): ``epochs``, ``seg_iters``, ``seeds``, ``jobs``,
            ``threads``, ``sizes`` (``inference``, ``train``, ``peak``:
            ``'HxW'``) and ``machine`` (``processor``, ``cpu_count``,
            ``torch``, ``date``).
        out_dir (str): Folder to write into (created).

    Returns:
        list[str]: The paths written.
    """
    os.makedirs(out_dir, exist_ok=True)
    rows = comparison_rows(runs, costs, detectors, segmentors)
    paths = [os.path.join(out_dir, name) for name in
             ('table.md', 'probe.md', 'comparison.json', 'map_vs_latency.png',
              'map_vs_train_memory.png')]
    with open(paths[0], 'w') as file:
        file.write(markdown_tables(rows, settings))
    with open(paths[1], 'w') as file:
        file.write(probe_table(probes, [*runs, *probes]))
    with open(paths[2], 'w') as file:
        json.dump(dict(settings=settings, **rows, probe=list(probes)), file,
                  indent=2)
    sizes = _sizes(settings)
    plot_map_against(rows['detection'], 'latency_s',
                     f"backbone inference at {sizes['inference']} (CPU seconds, "
                     f"{settings['threads']} thread)", paths[3])
    plot_map_against(rows['detection'], 'train_peak_mib_plain',
                     f"backbone training peak at {sizes['peak']} (MiB of live "
                     "memory)\nfilled: plain autograd; hollow: mmsoft's "
                     'memory-efficient path', paths[4], ours_also='train_peak_mib')
    return paths
