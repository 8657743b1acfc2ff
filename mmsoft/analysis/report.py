"""Writing benchmark results: JSON, CSV and a plot against the pixel count."""
import csv
import json
import os
from typing import Dict, List, Optional, Sequence

CSV_FIELDS = ('model', 'height', 'width', 'device', 'mode', 'batch', 'threads',
              'params', 'seconds', 'cpu_seconds', 'peak_bytes', 'gflops', 'error')
COMPONENTS = ('backbone', 'neck', 'rpn_head', 'roi_head')
DETECTOR_FIELDS = CSV_FIELDS[:-2] + tuple(f'saved_{c}' for c in COMPONENTS) + (
    'error', )
CAPACITY_FIELDS = ('model', 'height', 'width', 'limit_gb', 'largest_batch',
                   'per_image_bytes', 'fixed_bytes', 'method', 'error')


def _write_csv(path: str, fields: Sequence[str], rows: List[Dict]) -> None:
    with open(path, 'w', newline='') as file:
        writer = csv.DictWriter(file, fields, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(rows)


def detector_row(result: Dict) -> Dict:
    """A detector result with its saved bytes as ``saved_<component>`` fields."""
    saved = result.get('saved_bytes', {})
    return dict(result, **{f'saved_{c}': saved.get(c) for c in COMPONENTS})


def write_results(results: List[Dict], meta: Dict, out_dir: str,
                  detectors: Optional[List[Dict]] = None,
                  capacity: Optional[List[Dict]] = None) -> Dict[str, str]:
    """Writes ``results.json``, ``results.csv`` and ``scaling.png``, plus
    ``detectors.csv`` and ``capacity.csv`` when those are given.

    Args:
        results (list[dict]): One dict per (backbone, size) measurement.
        meta (dict): Run-wide facts (machine, threads, matmul throughput).
        out_dir (str): Folder to write into (created).
        detectors (list[dict], optional): One dict per detector training
            iteration. Default: None.
        capacity (list[dict], optional): Largest batch per backbone.
            Default: None.

    Returns:
        dict[str, str]: Paths written, by kind.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = dict(json=os.path.join(out_dir, 'results.json'),
                 csv=os.path.join(out_dir, 'results.csv'),
                 plot=os.path.join(out_dir, 'scaling.png'))
    with open(paths['json'], 'w') as file:
        json.dump(dict(meta=meta, results=results, detectors=detectors or [],
                       capacity=capacity or []), file, indent=2)
    _write_csv(paths['csv'], CSV_FIELDS, results)
    if detectors:
        paths['detectors'] = os.path.join(out_dir, 'detectors.csv')
        _write_csv(paths['detectors'], DETECTOR_FIELDS,
                   [detector_row(r) for r in detectors])
    if capacity:
        paths['capacity'] = os.path.join(out_dir, 'capacity.csv')
        _write_csv(paths['capacity'], CAPACITY_FIELDS, capacity)
    plot_scaling(results, paths['plot'], meta.get('mode', 'forward'))
    return paths


def plot_scaling(results: List[Dict], path: str, mode: str = 'forward') -> None:
    """Time and peak memory against megapixels, one line per model (log-log)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(12, 5))
    models = sorted({r['model'] for r in results})
    for model in models:
        rows = sorted((r for r in results
                       if r['model'] == model and r.get('seconds') is not None),
                      key=lambda r: r['height'] * r['width'])
        if not rows:
            continue
        pixels = [r['height'] * r['width'] / 1e6 for r in rows]
        time_axis.plot(pixels, [r['seconds'] for r in rows], 'o-', label=model)
        memory_axis.plot(pixels, [r['peak_bytes'] / 2**20 for r in rows], 'o-',
                         label=model)
    for axis, label in ((time_axis, f'{mode} time (s)'),
                        (memory_axis, 'peak memory (MiB)')):
        axis.set_xscale('log')
        axis.set_yscale('log')
        axis.set_xlabel('megapixels per image')
        axis.set_ylabel(label)
        axis.grid(True, which='both', alpha=0.3)
    time_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
