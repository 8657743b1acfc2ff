"""Writing benchmark results: JSON, CSV and a plot against the pixel count."""
import csv
import json
import os
from typing import Dict, List, Optional, Sequence

CSV_FIELDS = ('model', 'compile', 'height', 'width', 'device', 'mode', 'batch',
              'threads', 'params', 'compile_seconds', 'seconds', 'cpu_seconds',
              'peak_bytes', 'live_peak_bytes', 'gflops', 'error')
COMPONENTS = ('backbone', 'neck', 'rpn_head', 'roi_head')
DETECTOR_FIELDS = CSV_FIELDS[:-2] + tuple(f'saved_{c}' for c in COMPONENTS) + (
    'error', )
PEAK_FIELDS = ('model', 'height', 'width', 'device', 'batch', 'peak_bytes', 'error')
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
                  capacity: Optional[List[Dict]] = None,
                  peaks: Optional[List[Dict]] = None) -> Dict[str, str]:
    """Writes ``results.json``, ``results.csv`` and ``scaling.png``, plus
    ``detectors.csv``, ``capacity.csv`` and ``peaks.csv`` when those are
    given.

    Args:
        results (list[dict]): One dict per (backbone, size) measurement.
        meta (dict): Run-wide facts (machine, threads, matmul throughput).
        out_dir (str): Folder to write into (created).
        detectors (list[dict], optional): One dict per detector training
            iteration. Default: None.
        capacity (list[dict], optional): Largest batch per backbone.
            Default: None.
        peaks (list[dict], optional): Untimed training peaks (the live peak
            on CPU). Default: None.

    Returns:
        dict[str, str]: Paths written, by kind.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = dict(json=os.path.join(out_dir, 'results.json'),
                 csv=os.path.join(out_dir, 'results.csv'),
                 plot=os.path.join(out_dir, 'scaling.png'))
    with open(paths['json'], 'w') as file:
        json.dump(dict(meta=meta, results=results, detectors=detectors or [],
                       capacity=capacity or [], peaks=peaks or []), file, indent=2)
    _write_csv(paths['csv'], CSV_FIELDS, results)
    if detectors:
        paths['detectors'] = os.path.join(out_dir, 'detectors.csv')
        _write_csv(paths['detectors'], DETECTOR_FIELDS,
                   [detector_row(r) for r in detectors])
    if capacity:
        paths['capacity'] = os.path.join(out_dir, 'capacity.csv')
        _write_csv(paths['capacity'], CAPACITY_FIELDS, capacity)
    if peaks:
        paths['peaks'] = os.path.join(out_dir, 'peaks.csv')
        _write_csv(paths['peaks'], PEAK_FIELDS, peaks)
    plot_scaling(results, paths['plot'], meta.get('mode', 'forward'), peaks)
    return paths


def series_label(result: Dict) -> str:
    """A result's model, marked when it was measured compiled."""
    backend = result.get('compile')
    return result['model'] + (f' compiled ({backend})' if backend else '')


def plot_scaling(results: List[Dict], path: str, mode: str = 'forward',
                 peaks: Optional[List[Dict]] = None) -> None:
    """Time and peak memory against megapixels, one line per model (log-log).

    The memory is the peak of live memory where every result has it
    (``live_peak_bytes``), else the peak resident set; untimed ``peaks``
    (live peaks) add memory points when the memory axis is live.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    measured = [r for r in results if r.get('seconds') is not None]
    live = bool(measured) and all('live_peak_bytes' in r for r in measured)
    memory_field = 'live_peak_bytes' if live else 'peak_bytes'
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(12, 5))
    models = sorted({series_label(r) for r in results})
    for model in models:
        rows = sorted((r for r in results
                       if series_label(r) == model and r.get('seconds') is not None),
                      key=lambda r: r['height'] * r['width'])
        if not rows:
            continue
        pixels = [r['height'] * r['width'] / 1e6 for r in rows]
        time_axis.plot(pixels, [r['seconds'] for r in rows], 'o-', label=model)
        memory = {p: r[memory_field] for p, r in zip(pixels, rows)}
        if live:
            memory.update({r['height'] * r['width'] / 1e6: r['peak_bytes']
                           for r in peaks or []
                           if series_label(r) == model and 'peak_bytes' in r})
        memory_axis.plot(sorted(memory), [memory[p] / 2**20 for p in sorted(memory)],
                         'o-', label=model)
    memory_label = 'peak live memory (MiB)' if live else 'peak resident memory (MiB)'
    for axis, label in ((time_axis, f'{mode} time (s)'), (memory_axis, memory_label)):
        axis.set_xscale('log')
        axis.set_yscale('log')
        axis.set_xlabel('megapixels per image')
        axis.set_ylabel(label)
        axis.grid(True, which='both', alpha=0.3)
    if time_axis.lines:
        time_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
