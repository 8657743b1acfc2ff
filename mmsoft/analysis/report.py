"""Writing benchmark results: JSON, CSV and a plot against the pixel count."""
import csv
import json
import os
from typing import Dict, List

CSV_FIELDS = ('model', 'height', 'width', 'device', 'mode', 'threads', 'params',
              'seconds', 'peak_bytes', 'gflops', 'error')


def write_results(results: List[Dict], meta: Dict, out_dir: str) -> Dict[str, str]:
    """Writes ``results.json``, ``results.csv`` and ``scaling.png``.

    Args:
        results (list[dict]): One dict per (model, size) measurement.
        meta (dict): Run-wide facts (machine, threads, matmul throughput).
        out_dir (str): Folder to write into (created).

    Returns:
        dict[str, str]: Paths written, by kind.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = dict(json=os.path.join(out_dir, 'results.json'),
                 csv=os.path.join(out_dir, 'results.csv'),
                 plot=os.path.join(out_dir, 'scaling.png'))
    with open(paths['json'], 'w') as file:
        json.dump(dict(meta=meta, results=results), file, indent=2)
    with open(paths['csv'], 'w', newline='') as file:
        writer = csv.DictWriter(file, CSV_FIELDS, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(results)
    plot_scaling(results, paths['plot'])
    return paths


def plot_scaling(results: List[Dict], path: str) -> None:
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
    for axis, label in ((time_axis, 'forward time (s)'),
                        (memory_axis, 'peak memory (MiB)')):
        axis.set_xscale('log')
        axis.set_yscale('log')
        axis.set_xlabel('megapixels (batch 1)')
        axis.set_ylabel(label)
        axis.grid(True, which='both', alpha=0.3)
    time_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
