"""The GPU benchmark's tables: its records gathered into rows, the ratios
against the peers, the GPU targets (docs/cost.md), and the Markdown.

A *record* is one setting (model, phase, precision, mode) measured in one
round's process; a *row* gathers the rounds of one setting: the median and
interquartile range of all their timed steps, the spread of the rounds'
medians, the launches and GPU-busy time of the round that counted them, and
the highest memory peaks.
"""
import dataclasses
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

#: The fields that make a row: one setting over its rounds.
ROW_KEY = ('phase', 'model', 'input', 'precision', 'mode', 'compiled')
#: (model, peer) pairs of the ratio table: the targets' peers, and
#: SOFT++-small against PVTv2-b2-li.
RATIO_PAIRS = (('soft++-tiny', 'swin-t'), ('ufo-vit-small', 'swin-t'),
               ('soft++-small', 'pvtv2-b2'), ('soft++-small', 'pvtv2-b2-li'))
#: Phases whose times are not a timing protocol's (too few steps for ratios).
UNTIMED_PHASES = ('regions', )
#: Phases whose rows are compared as one: the Mask R-CNN's two.
SAME_TABLE = {'detector-others': 'detector'}
TARGET_PRECISIONS = ('float32', 'amp')
#: Regions named in a target's explanation: the slowest few.
WHY_REGIONS = 3


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU target (docs/cost.md), on one card, eager, for each of
    :data:`TARGET_PRECISIONS`.

    Args:
        what (str): What is compared, for the table.
        phase (str): The phase that measures it.
        mode (str): ``'train'`` or ``'inference'``.
        model (str): The model held to the goal.
        peer (str, optional): The model it is compared with; None for a
            goal on the model's own figure.
        metric (str): ``'time'`` (median step), ``'kernels'`` (per step),
            ``'memory'`` (``max_memory_allocated``) or ``'busy_share'``.
        goal (float): The ratio (or share) to reach.
        at_least (bool): The figure must reach ``goal`` from below (a
            share); otherwise stay at or under it. Default: False.
    """
    what: str
    phase: str
    mode: str
    model: str
    peer: Optional[str]
    metric: str
    goal: float
    at_least: bool = False

    def describe(self) -> str:
        """E.g. ``'soft++-tiny / swin-t, training step time <= 1x'``."""
        if self.peer is None:
            return f'{self.model}, {self.what} >= {self.goal:.0%}'
        return f'{self.model} / {self.peer}, {self.what} <= {self.goal:g}x'


TARGETS = (
    *(Target('training step time', 'eager', 'train', model, peer, 'time', 1.)
      for model, peer in (('soft++-tiny', 'swin-t'), ('ufo-vit-small', 'swin-t'),
                          ('soft++-small', 'pvtv2-b2'))),
    Target('inference time', 'eager', 'inference', 'soft++-tiny', 'swin-t', 'time',
           0.8),
    *(Target('kernel launches per training step', 'eager', 'train', model, 'swin-t',
             'kernels', 1.5)
      for model in ('soft++-tiny', 'soft++-small', 'ufo-vit-small')),
    *(Target('GPU busy share of the training step', 'eager', 'train', model, None,
             'busy_share', 0.8, at_least=True)
      for model in ('soft++-tiny', 'soft++-small')),
    Target('max_memory_allocated of the training step', 'memory', 'train',
           'soft++-tiny', 'swin-t', 'memory', 0.5),
    Target('max_memory_allocated of the training step', 'memory', 'train',
           'ufo-vit-small', 'swin-t', 'memory', 0.7),
    Target('Mask R-CNN training step time', 'detector', 'train', 'soft++-tiny',
           'swin-t', 'time', 1.),
)


# --- Rows
def _quartiles(values: Sequence[float]) -> Tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method='inclusive')
    return q1, q3


def _row(key: Tuple, group: List[Dict]) -> Dict:
    ok = [r for r in group if r['status'] == 'ok']
    first = group[0]
    row = dict(zip(ROW_KEY, key), label=first['label'], backbone=first['backbone'],
               source=first['source'], detector=first.get('detector'),
               input_desc=first['input_desc'], rounds=len(ok),
               errors=[r['error'] for r in group if r['status'] == 'error'],
               notes=sorted({r['note'] for r in group
                             if r['status'] == 'skipped' and r.get('note')}),
               median_ms=None, q1_ms=None, q3_ms=None, min_ms=None, max_ms=None,
               steps=0, round_medians_ms=[], host_ms=None, kernels=None,
               copies=None, launch_calls=None, busy_ms=None, busy_share=None,
               max_memory_allocated_mib=None, max_memory_reserved_mib=None,
               allocated_before_mib=None, compile_s=None,
               params_m=first.get('params_m'), regions=None, matmul_tflop_per_s=None)
    if len(ok) == len(group):
        row['status'] = 'ok'
    elif ok:
        row['status'] = 'partial'
    else:
        row['status'] = 'error' if row['errors'] else 'skipped'
    times = [t for r in ok for t in r['times_ms'] or []]
    if times:
        q1, q3 = _quartiles(times)
        row.update(median_ms=statistics.median(times), q1_ms=q1, q3_ms=q3,
                   min_ms=min(times), max_ms=max(times), steps=len(times),
                   round_medians_ms=[statistics.median(r['times_ms']) for r in ok
                                     if r['times_ms']],
                   host_ms=statistics.median(t for r in ok for t in r['host_ms']))
    counted = next((r for r in ok if r.get('kernels') is not None), None)
    if counted is not None:
        row.update({name: counted[name] for name in
                    ('kernels', 'copies', 'launch_calls', 'busy_ms')})
        if row['median_ms']:
            row['busy_share'] = counted['busy_ms'] / row['median_ms']
    for name in ('max_memory_allocated_mib', 'max_memory_reserved_mib',
                 'allocated_before_mib'):
        values = [r[name] for r in ok if r.get(name) is not None]
        row[name] = max(values) if values else None
    compiled = [r['compile_s'] for r in ok if r.get('compile_s') is not None]
    row['compile_s'] = compiled[0] if compiled else None
    profiled = next((r for r in ok if r.get('regions')), None)
    if profiled is not None:
        row['regions'] = profiled['regions']
        row['matmul_tflop_per_s'] = profiled.get('matmul_tflop_per_s')
    return row


def aggregate(records: Sequence[Dict]) -> List[Dict]:
    """The rows of ``records``, one per setting (:data:`ROW_KEY`), in the
    order their first records came.

    Each row: the setting, ``status`` (``'ok'``: every round measured;
    ``'partial'``; ``'error'``; ``'skipped'``), ``median_ms``, ``q1_ms``,
    ``q3_ms``, ``min_ms``, ``max_ms`` and ``steps`` of all timed steps,
    ``round_medians_ms``, ``host_ms`` (median), ``kernels``, ``copies``,
    ``launch_calls``, ``busy_ms`` (per step) and ``busy_share`` (``busy_ms``
    over ``median_ms``), the highest ``max_memory_allocated_mib``,
    ``max_memory_reserved_mib`` and ``allocated_before_mib`` (held before
    the timed steps: weights and the optimizer's state), ``compile_s``,
    ``regions``, ``errors`` and the skipped records' ``notes``.
    """
    groups: Dict[Tuple, List[Dict]] = {}
    for record in records:
        groups.setdefault(tuple(record[name] for name in ROW_KEY), []).append(record)
    return [_row(key, group) for key, group in groups.items()]


def _key(row: Dict, **changes) -> Tuple:
    """A row's setting, the phases of one table as one."""
    values = dict(row, **changes)
    values['phase'] = SAME_TABLE.get(values['phase'], values['phase'])
    return tuple(values[name] for name in ROW_KEY)


def _ratio(numerator, denominator) -> Optional[float]:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ratio_rows(rows: Sequence[Dict]) -> List[Dict]:
    """For each measured row of a model of :data:`RATIO_PAIRS` whose peer
    was measured in the same setting: ``time`` (median over median),
    ``kernels``, ``memory`` (``max_memory_allocated``) ratios, both busy
    shares, and both medians."""
    index = {_key(row): row for row in rows}
    ratios = []
    for row in rows:
        if row['phase'] in UNTIMED_PHASES or row['median_ms'] is None:
            continue
        for model, peer in RATIO_PAIRS:
            if row['model'] != model:
                continue
            other = index.get(_key(row, model=peer))
            if other is None or other['median_ms'] is None:
                continue
            ratios.append(dict(
                phase=row['phase'], input=row['input'], precision=row['precision'],
                mode=row['mode'], compiled=row['compiled'], model=model, peer=peer,
                label=row['label'], peer_label=other['label'],
                model_ms=row['median_ms'],
                peer_ms=other['median_ms'],
                time=row['median_ms'] / other['median_ms'],
                kernels=_ratio(row['kernels'], other['kernels']),
                memory=_ratio(row['max_memory_allocated_mib'],
                              other['max_memory_allocated_mib']),
                busy_share=row['busy_share'], peer_busy_share=other['busy_share']))
    return ratios


# --- Targets
_METRICS = {'time': 'median_ms', 'kernels': 'kernels',
            'memory': 'max_memory_allocated_mib', 'busy_share': 'busy_share'}


def _find(rows: Sequence[Dict], phase: str, model: str, precision: str,
          mode: str) -> Optional[Dict]:
    return next((row for row in rows if row['phase'] == phase and row['model'] == model
                 and row['precision'] == precision and row['mode'] == mode
                 and not row['compiled']), None)


def _missing(row: Optional[Dict], model: str, metric: str) -> Optional[str]:
    """Why ``row`` gives no figure for ``metric``, or None."""
    if row is None:
        return f'{model} not run'
    if row['median_ms'] is None:
        detail = (row['errors'] or row['notes'] or [row['status']])[0]
        return f'{model} {row["status"]}: {detail}'
    if row[_METRICS[metric]] is None:
        return f"{model}'s {metric.replace('_', ' ')} is not measured on this device"
    return None


def describe_row(row: Dict) -> str:
    """A row's figures in a few words: time, kernels, GPU busy, memory."""
    parts = [f"{row['label']}: {row['median_ms']:.1f} ms"]
    if row['kernels'] is not None:
        parts.append(f"{row['kernels']:.0f} kernels")
    if row['busy_ms'] is not None:
        parts.append(f"GPU busy {row['busy_ms']:.1f} ms ({row['busy_share']:.0%})")
    if row['max_memory_allocated_mib'] is not None:
        parts.append(f"{row['max_memory_allocated_mib']:.0f} MiB allocated")
    return ', '.join(parts)


def describe_regions(row: Optional[Dict], count: int = WHY_REGIONS) -> Optional[str]:
    """The ``count`` slowest regions of a regions-phase row: time, FLOP
    rate and kernels."""
    if row is None or not row.get('regions'):
        return None
    slowest = sorted(row['regions'].items(), key=lambda item: -item[1]['ms'])[:count]
    parts = []
    for name, entry in slowest:
        rate = ('' if entry['tflop_per_s'] is None
                else f" at {entry['tflop_per_s']:.3g} TFLOP/s")
        parts.append(f"{name} {entry['ms']:.1f} ms{rate}, {entry['kernels']} kernels")
    return 'slowest regions: ' + '; '.join(parts)


def evaluate_targets(rows: Sequence[Dict]) -> List[Dict]:
    """Each target of :data:`TARGETS` for each of :data:`TARGET_PRECISIONS`:
    ``value`` (the ratio, or the share), ``status`` (``'met'``, ``'missed'``
    or ``'not measured'``), ``reason`` (why not measured) and ``why``: the
    model's and the peer's figures, and the model's slowest regions where
    the regions phase profiled it."""
    results = []
    for target in TARGETS:
        for precision in TARGET_PRECISIONS:
            row = _find(rows, target.phase, target.model, precision, target.mode)
            peer = (None if target.peer is None else
                    _find(rows, target.phase, target.peer, precision, target.mode))
            result = dict(dataclasses.asdict(target), precision=precision,
                          target=target.describe(), value=None,
                          status='not measured', reason=None, why=None)
            reason = _missing(row, target.model, target.metric)
            if reason is None and target.peer is not None:
                reason = _missing(peer, target.peer, target.metric)
            if reason is not None:
                result['reason'] = reason
                results.append(result)
                continue
            figure = row[_METRICS[target.metric]]
            value = figure if peer is None else figure / peer[_METRICS[target.metric]]
            met = value >= target.goal if target.at_least else value <= target.goal
            why = [describe_row(row)] + ([describe_row(peer)] if peer else [])
            regions = describe_regions(_find(rows, 'regions', target.model, precision,
                                             target.mode))
            if regions:
                whose = "'s backbone's" if target.phase == 'detector' else "'s"
                why.append(f"{row['label']}{whose} {regions}")
            result.update(value=value, status='met' if met else 'missed',
                          why='; '.join(why))
            results.append(result)
    return results


def summarise(records: Sequence[Dict]) -> Dict:
    """Record counts by status and the labels of the skipped and failed."""
    summary = {status: sum(r['status'] == status for r in records)
               for status in ('ok', 'error', 'skipped')}
    summary['skipped_cases'] = [record_label(r) for r in records
                                if r['status'] == 'skipped']
    summary['failed_cases'] = [f"{record_label(r)}: {r['error']}" for r in records
                               if r['status'] == 'error']
    return summary


def record_label(record: Dict) -> str:
    """E.g. ``'eager soft++-tiny amp train, round 1'``."""
    compiled = ' compiled' if record.get('compiled') else ''
    return (f"{record['phase']} {record['model']}{compiled} {record['precision']} "
            f"{record['mode']}, round {record['round'] + 1}")


# --- Markdown
def _cell(value, digits: int = 1, suffix: str = '') -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:.{digits}f}{suffix}'
    return str(value).replace('|', '\\|').replace('\n', ' ') + suffix


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return lines + ['| ' + ' | '.join(row) + ' |' for row in rows]


def _status(row: Dict) -> str:
    detail = (row['errors'] or row['notes'] or [''])[0]
    if row['status'] == 'partial':
        return _cell(f"{row['rounds']} round(s)" + (f'; {detail}' if detail else ''))
    return _cell(row['status'] + (f': {detail}' if detail and row['status'] != 'ok'
                                  else ''))


def _rows_table(rows: Sequence[Dict], eager: Dict[Tuple, Dict]) -> List[str]:
    compiled = any(row['compiled'] for row in rows)
    header = ['model', 'precision', 'mode', 'median ms', 'IQR ms', "rounds' medians",
              'host ms', 'kernels / step', 'launch calls', 'GPU busy ms (share)',
              'max allocated MiB', 'max reserved MiB']
    if compiled:
        header += ['compile s', 'x eager']
    body = []
    for row in rows:
        iqr = (None if row['q1_ms'] is None
               else f"{row['q1_ms']:.1f}-{row['q3_ms']:.1f}")
        busy = (None if row['busy_ms'] is None
                else f"{row['busy_ms']:.1f} ({row['busy_share']:.0%})")
        cells = [row['label'], row['precision'], row['mode'], _cell(row['median_ms']),
                 _cell(iqr),
                 _cell(', '.join(f'{m:.1f}' for m in row['round_medians_ms']) or None),
                 _cell(row['host_ms']), _cell(row['kernels'], 0),
                 _cell(row['launch_calls'], 0), _cell(busy),
                 _cell(row['max_memory_allocated_mib'], 0),
                 _cell(row['max_memory_reserved_mib'], 0)]
        if compiled:
            base = eager.get((row['model'], row['input'], row['precision'],
                              row['mode']))
            cells += [_cell(row['compile_s']),
                      _cell(_ratio(row['median_ms'], base and base['median_ms']), 2)]
        body.append(cells + [_status(row)])
    return _table(header + ['status'], body)


def _regions_tables(rows: Sequence[Dict]) -> List[str]:
    from .op_profile import REGION_ORDER
    lines = []
    settings = []
    for row in rows:
        if row['regions'] and (row['precision'], row['mode']) not in settings:
            settings.append((row['precision'], row['mode']))
    for precision, mode in settings:
        chosen = [row for row in rows if row['regions']
                  and (row['precision'], row['mode']) == (precision, mode)]
        names = set().union(*(row['regions'] for row in chosen))
        ordered = [name for name in REGION_ORDER if name in names]
        ordered += sorted(names - set(ordered))
        rate = next((row['matmul_tflop_per_s'] for row in chosen
                     if row['matmul_tflop_per_s']), None)
        lines += ['', f'### Regions: {mode}, {precision}', '',
                  "Each cell: the time of the region's operators in one profiled "
                  'step (kernel time on a GPU; in training with their backward), '
                  'ms; their achieved FLOP rate, TFLOP/s; the kernels they '
                  'launched.' + (
                      '' if rate is None else
                      f' A float32 2048^3 matmul runs at {rate:.1f} TFLOP/s here.'), '']
        body = []
        for name in ordered:
            cells = [name]
            for row in chosen:
                entry = row['regions'].get(name)
                if entry is None:
                    cells.append('-')
                    continue
                rate_text = ('-' if entry['tflop_per_s'] is None
                             else f"{entry['tflop_per_s']:.3g}")
                cells.append(f"{entry['ms']:.2f} ms, {rate_text}, {entry['kernels']}")
            body.append(cells)
        lines += _table(['region'] + [row['label'] for row in chosen], body)
    return lines


PHASE_TITLES = {
    'eager': 'Backbones, eager',
    'memory': 'Backbones, eager: memory of the training step',
    'detector': 'Mask R-CNN, eager',
    'detector-others': 'Mask R-CNN, eager, the other models',
    'regions': 'Where the time goes: regions of the training step and inference',
    'single': 'Backbones, eager, one image',
    'compiled': 'Backbones, compiled (torch.compile)',
}


def _meta_lines(meta: Dict) -> List[str]:
    protocol = meta.get('protocol', {})
    memory = (f", {meta['device_memory_gib']:.0f} GiB"
              if meta.get('device_memory_gib') else '')
    lines = [f"{meta.get('device_name')} ({meta.get('device')}{memory}); torch "
             f"{meta.get('torch')}, CUDA {meta.get('cuda')}, cuDNN "
             f"{meta.get('cudnn')}; Python {meta.get('python')}; host CPU: "
             f"{meta.get('host_cpu')}; {meta.get('date')}.", '',
             'TF32: `torch.backends.cuda.matmul.allow_tf32='
             f"{meta.get('tf32_matmul')}`, "
             f"`torch.backends.cudnn.allow_tf32={meta.get('tf32_cudnn')}`, "
             f"`float32_matmul_precision={meta.get('float32_matmul_precision')!r}` "
             "(torch's defaults, unchanged)."
             + (f" GPU: {meta['nvidia_smi']}." if meta.get('nvidia_smi') else ''),
             '', f"Commit: {meta.get('commit') or 'unknown'}. Command: "
             f"`{meta.get('command')}`.", '',
             f"Protocol: each model in a fresh process per round, the models in turn, "
             f"the order reversed every other round; per setting "
             f"{protocol.get('warmup')} warm-up and {protocol.get('steps_per_round')} "
             f"timed steps per round, {protocol.get('rounds')} round(s) "
             f"({protocol.get('steps')} timed steps)"
             + ('' if protocol.get('meets_protocol_minimum') else
                ', fewer than the protocol asks (10 warm-up, 30 timed)') + '. '
             f"Time: {protocol.get('timer')}, each step synchronised; median and "
             'interquartile range of all timed steps, and each round\'s median. '
             f"Kernels, copies and launch calls: `torch.profiler` over "
             f"{protocol.get('profile_steps')} step(s), per step; GPU busy: the union "
             "of the kernels', copies' and memsets' intervals per step, its share of "
             'the median step. Memory: `max_memory_allocated` and '
             '`max_memory_reserved` over the timed steps (weights, gradients and '
             "AdamW's state included). A training step: forward, loss, backward, "
             'AdamW step; backbones: the sum of the maps\' means as the loss. '
             f"AMP: {protocol.get('amp_dtype')} autocast with `torch.amp.GradScaler`. "
             "mmsoft's backbones get each image's valid region; the peers see the "
             'padded canvas.']
    if meta.get('detector'):
        lines += ['', f"Mask R-CNN: {meta['detector']} "
                  f"({meta.get('detector_reason')})."]
    if meta.get('peers_note'):
        lines += ['', meta['peers_note']]
    if str(meta.get('device', '')).startswith('cpu'):
        lines += ['', '**CPU smoke mode**: tiny inputs and few steps; the kernels, '
                  'GPU-busy and memory columns are CUDA-only, and the times are not '
                  'GPU figures.']
    return lines


def format_markdown(data: Dict) -> str:
    """The results as Markdown: the setting and protocol, the targets, one
    table per phase, the ratios, the regions, the tests, what was skipped
    or failed, and each phase's seconds."""
    meta = data.get('meta', {})
    rows, ratios, targets = data.get('rows', []), data.get('ratios', []), \
        data.get('targets', [])
    lines = ['# GPU benchmark', ''] + _meta_lines(meta)
    lines += ['', '## Targets on the GPU', '']
    lines += _table(['target', 'precision', 'value', 'status', 'the numbers'], [
        [t['target'], t['precision'],
         _cell(t['value'], 2) if t['metric'] != 'busy_share' or t['value'] is None
         else f"{t['value']:.0%}",
         t['status'], _cell(t['why'] or t['reason'])] for t in targets])
    eager = {(r['model'], r['input'], r['precision'], r['mode']): r for r in rows
             if not r['compiled']}
    for phase in dict.fromkeys(row['phase'] for row in rows):
        chosen = [row for row in rows if row['phase'] == phase]
        title = PHASE_TITLES.get(phase, phase)
        lines += ['', f"## {title} ({phase}): {chosen[0]['input_desc']}", '']
        if chosen[0].get('detector'):
            lines += [f"Detector: {chosen[0]['detector']}'s Mask R-CNN.", '']
        lines += _rows_table(chosen, eager)
    if ratios:
        lines += ['', '## Ratios against the peers', '',
                  'Model over peer in the same setting: median time, kernels per '
                  'step, `max_memory_allocated`; the GPU-busy shares of both.', '']
        lines += _table(['phase', 'precision', 'mode', 'model / peer', 'time',
                         'kernels', 'max allocated', 'GPU busy (model, peer)'], [
            [r['phase'] + (' (compiled)' if r['compiled'] else ''), r['precision'],
             r['mode'], f"{r['label']} / {r['peer_label']}", _cell(r['time'], 2),
             _cell(r['kernels'], 2), _cell(r['memory'], 2),
             _cell(None if r['busy_share'] is None else
                   f"{r['busy_share']:.0%}, " + _cell(
                       None if r['peer_busy_share'] is None
                       else f"{r['peer_busy_share']:.0%}"))] for r in ratios])
    regions = _regions_tables(rows)
    if regions:
        lines += ['', '## Regions'] + regions
    tests = data.get('tests', {})
    if tests.get('ran'):
        from .gpu_check import describe_tests
        lines += ['', '## Tests', '', describe_tests(tests) + '.']
        if tests.get('failed_tests'):
            lines += ['', 'Failed: ' + ', '.join(tests['failed_tests']) + '.']
    elif tests.get('error'):
        lines += ['', '## Tests', '', f"Not run: {tests['error']}."]
    summary = data.get('summary', {})
    lines += ['', '## Run', '',
              f"{summary.get('ok', 0)} measured, {summary.get('error', 0)} failed, "
              f"{summary.get('skipped', 0)} skipped; budget "
              f"{_cell(meta.get('budget_s'), 0)} s."]
    phases = data.get('phases', {})
    if phases:
        lines += ['', 'Seconds per phase: ' + ', '.join(
            f"{name} {entry['seconds']:.0f}" for name, entry in phases.items()) + '.']
    if summary.get('skipped_cases'):
        lines += ['', 'Skipped: ' + '; '.join(summary['skipped_cases']) + '.']
    if summary.get('failed_cases'):
        lines += ['', 'Failed: ' + '; '.join(summary['failed_cases']) + '.']
    return '\n'.join(lines) + '\n'
