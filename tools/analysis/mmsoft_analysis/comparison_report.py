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

from .comparison import (BBOX_METRIC, MIOU_METRIC, SEGM_METRIC, Entry,
                         seed_summary)

MIB = 2**20


def _by_model(records: Sequence[Dict]) -> Dict[str, Dict]:
    return {record['model']: record for record in records if 'error' not in record}


def cost_fields(entry: Entry, costs: Optional[Dict]) -> Dict:
    """The cost columns of ``entry``'s backbone (None where not measured).

    Args:
        entry (Entry): A detector entry (its config is the benchmark spec).
        costs (dict, optional): ``inference`` and ``train``: the two
            benchmark runs' ``results.json``.

    Returns:
        dict: ``params_m``, ``gflops`` (800x1333), ``latency_s`` (inference
        at 800x1333, fastest CPU seconds), ``train_iter_s`` (forward and
        backward at 800x1333, fastest CPU seconds) and ``train_peak_mib``
        (live peak of training at 1536x1536).
    """
    fields = dict(params_m=None, gflops=None, latency_s=None, train_iter_s=None,
                  train_peak_mib=None)
    if not costs:
        return fields
    inference = _by_model(costs['inference']['results']).get(entry.config, {})
    training = _by_model(costs['train']['results']).get(entry.config, {})
    peak = _by_model(costs['train']['peaks']).get(entry.config, {})
    if 'params' in inference:
        fields['params_m'] = inference['params'] / 1e6
    fields['gflops'] = inference.get('gflops')
    fields['latency_s'] = inference.get('cpu_seconds')
    fields['train_iter_s'] = training.get('cpu_seconds')
    if 'peak_bytes' in peak:
        fields['train_peak_mib'] = peak['peak_bytes'] / MIB
    return fields


def metric_fields(entry: Entry, runs: Sequence[Dict], task: str,
                  metrics: Sequence[str]) -> Dict:
    """Each metric's :func:`~.comparison.seed_summary` over ``entry``'s
    finished runs of ``task``, with the seeds and the mean training time."""
    mine = sorted((run for run in runs if run['task'] == task
                   and run['config'] == entry.config), key=lambda run: run['seed'])
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
                      pair=entry.pair, ours=entry.ours, **cost_fields(entry, costs),
                      **metric_fields(entry, runs, 'detection',
                                      (BBOX_METRIC, SEGM_METRIC)))
                 for entry in detectors]
    segmentation = [dict(name=entry.name, config=entry.config, source=entry.source,
                         pair=entry.pair, ours=entry.ours,
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


def markdown_tables(rows: Dict[str, List[Dict]], settings: Dict) -> str:
    """The detection and segmentation tables, with the settings they come from."""
    machine, sizes = settings['machine'], _sizes(settings)
    lines = [
        f"Demo data, the demo schedules compressed to {settings['epochs']} "
        f"epochs (Mask R-CNN) and {settings['seg_iters']} iterations (UperNet); "
        f"seeds {', '.join(map(str, settings['seeds']))}; {settings['jobs']} "
        f"runs at a time with {settings['threads']} thread each; "
        f"{machine['processor']}, {machine['cpu_count']} cores, torch "
        f"{machine['torch']}, {machine['date']}.", '',
        f"| backbone | source | pair | config | params (M) | GFLOPs "
        f"{sizes['inference']} | inference {sizes['inference']} (CPU s) | "
        f"training iteration {sizes['train']} (CPU s) | training peak "
        f"{sizes['peak']} (MiB) | bbox mAP | segm mAP | training (min) |",
        '|---|---|---|---|---:|---:|---:|---:|---:|---|---|---:|']
    for row in rows['detection']:
        lines.append(
            f"| {row['name']} | {row['source']} | {row['pair']} | "
            f"[{os.path.basename(row['config'])}](../../{row['config']}) | "
            f"{_number(row['params_m'], 1)} | {_number(row['gflops'], 1)} | "
            f"{_number(row['latency_s'], 2)} | {_number(row['train_iter_s'], 2)} | "
            f"{_number(row['train_peak_mib'], 0)} | {_metric(row[BBOX_METRIC])} | "
            f"{_metric(row[SEGM_METRIC])} | {_number(row.get('train_minutes'), 1)} |")
    lines += ['', '| backbone | source | config | mIoU (%) | training (min) |',
              '|---|---|---|---|---:|']
    for row in rows['segmentation']:
        lines.append(
            f"| {row['name']} | {row['source']} | "
            f"[{os.path.basename(row['config'])}](../../{row['config']}) | "
            f"{_metric(row[MIOU_METRIC])} | {_number(row.get('train_minutes'), 1)} |")
    return '\n'.join(lines) + '\n'


def plot_map_against(rows: Sequence[Dict], cost: str, label: str, path: str) -> None:
    """bbox mAP (mean, the seeds' range as error bars) against one cost
    column, one point per backbone; mmsoft's backbones in red."""
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
    axes.margins(x=0.15)  # room for the labels of the outermost points
    axes.set_xlabel(label)
    axes.set_ylabel('bbox mAP (demo data; bars: range over seeds)')
    axes.set_title('mmsoft (red) and the libraries\' backbones (blue)')
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(runs: Sequence[Dict], costs: Optional[Dict],
                 detectors: Sequence[Entry], segmentors: Sequence[Entry],
                 settings: Dict, out_dir: str) -> List[str]:
    """Writes ``table.md``, ``comparison.json``, ``map_vs_latency.png``
    and ``map_vs_train_memory.png`` in ``out_dir``.

    Args:
        runs (Sequence[dict]): The finished runs' ``result.json`` contents.
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
             ('table.md', 'comparison.json', 'map_vs_latency.png',
              'map_vs_train_memory.png')]
    with open(paths[0], 'w') as file:
        file.write(markdown_tables(rows, settings))
    with open(paths[1], 'w') as file:
        json.dump(dict(settings=settings, **rows), file, indent=2)
    sizes = _sizes(settings)
    plot_map_against(rows['detection'], 'latency_s',
                     f"backbone inference at {sizes['inference']} (CPU seconds, "
                     f"{settings['threads']} thread)", paths[2])
    plot_map_against(rows['detection'], 'train_peak_mib',
                     f"backbone training peak at {sizes['peak']} (MiB of live "
                     'memory)', paths[3])
    return paths
