"""The benchmark's report: ``results.json`` (every record, row and target)
and ``results.md`` (the tables); a row gathers the rounds of one setting.
"""
import json
import os
import statistics
from typing import Dict, List, Optional, Sequence

#: The fields that make a row.
ROW_KEY = ('detector', 'input', 'compiled', 'mode', 'precision', 'label')
MEMORY = ('peak_mib', 'live_peak_mib', 'max_allocated_mib', 'max_reserved_mib')
#: The GPU targets (docs/cost.md): model, peer (None: the model's own
#: figure), mode, row field, goal, and whether the figure must reach it.
TARGETS = (
    ('soft++-tiny', 'swin-t', 'train', 'median_ms', 1.0, False),
    ('ufo-vit-small', 'swin-t', 'train', 'median_ms', 1.0, False),
    ('soft++-small', 'pvtv2-b2', 'train', 'median_ms', 1.0, False),
    ('soft++-tiny', 'swin-t', 'inference', 'median_ms', 0.8, False),
    ('soft++-tiny', 'swin-t', 'train', 'kernels', 1.5, False),
    ('ufo-vit-small', 'swin-t', 'train', 'kernels', 1.5, False),
    ('soft++-tiny', None, 'train', 'busy_share', 0.8, True),
    ('soft++-small', None, 'train', 'busy_share', 0.8, True),
    ('soft++-tiny', 'swin-t', 'train', 'max_allocated_mib', 0.5, False),
    ('ufo-vit-small', 'swin-t', 'train', 'max_allocated_mib', 0.7, False),
)


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _row(records: List[Dict]) -> Dict:
    ok = [r for r in records if r['status'] == 'ok' and not r.get('live')]
    first = records[0]
    row = {key: first[key] for key in ROW_KEY}
    row.update(spec=first['spec'], params_m=first.get('params_m'),
               gflops=first.get('gflops'), rounds=len(ok),
               status='ok' if all(r['status'] == 'ok' for r in records) else
               next(r['status'] for r in records if r['status'] != 'ok'),
               errors=sorted({r.get('error') or r.get('note') for r in records
                              if r['status'] != 'ok'}))
    times = [t for r in ok for t in r.get('times_ms', [])]
    row.update(median_ms=_median(times), steps=len(times),
               round_medians_ms=[_median(r['times_ms']) for r in ok
                                 if r.get('times_ms')],
               cpu_ms=min((t for r in ok for t in r.get('cpu_ms', [])), default=None),
               host_ms=_median([t for r in ok for t in r.get('host_ms', [])]))
    if len(times) > 1:
        row['q1_ms'], _, row['q3_ms'] = statistics.quantiles(times, n=4,
                                                             method='inclusive')
    for field in MEMORY + ('compile_s', 'largest_batch', 'host_sync', 'saved_mib'):
        values = [r[field] for r in records if r.get(field) is not None]
        row[field] = max(values) if field in MEMORY and values else (
            values[0] if values else None)
    counted = next((r for r in ok if r.get('kernels') is not None), {})
    row.update({key: counted.get(key)
                for key in ('kernels', 'copies', 'launch_calls', 'busy_ms')})
    row['busy_share'] = (row['busy_ms'] / row['median_ms']
                         if row['busy_ms'] and row['median_ms'] else None)
    profiled = next((r for r in ok if r.get('regions')), None)
    row.update(regions=profiled and profiled['regions'],
               classes=profiled and profiled['classes'])
    return row


def make_rows(records: Sequence[Dict]) -> List[Dict]:
    """One row per setting (:data:`ROW_KEY`), in the order first measured,
    with ``vs_first``: its time (and CPU time, and memory) over the first
    model's of the same setting, the median of the rounds' ratios."""
    groups: Dict[tuple, List[Dict]] = {}
    for record in records:
        groups.setdefault(tuple(record[k] for k in ROW_KEY), []).append(record)
    rows = {key: _row(group) for key, group in groups.items()}
    first_label = records[0]['label'] if records else None
    for key, row in rows.items():
        reference = groups.get(key[:-1] + (first_label, ), [])
        mine = {r['round']: r for r in groups[key] if r.get('times_ms')}
        ratios = [_median(mine[r['round']]['times_ms']) / _median(r['times_ms'])
                  for r in reference if r.get('times_ms') and r['round'] in mine]
        cpu = [min(mine[r['round']]['cpu_ms']) / min(r['cpu_ms'])
               for r in reference if r.get('cpu_ms') and r['round'] in mine]
        base = rows.get(key[:-1] + (first_label, ), {})
        memory = next((f for f in ('live_peak_mib', 'max_allocated_mib', 'peak_mib')
                       if row.get(f) and base.get(f)), None)
        row.update(vs_first=_median(ratios), vs_first_cpu=_median(cpu),
                   vs_first_memory=memory and row[memory] / base[memory],
                   round_ratios=ratios)
    return list(rows.values())


def evaluate_targets(rows: Sequence[Dict]) -> List[Dict]:
    """Each target of :data:`TARGETS` in each setting where its rows were
    measured eager: the value, met or missed, and both rows' figures."""
    found = []
    for model, peer, mode, field, goal, at_least in TARGETS:
        for row in rows:
            if row['label'] != model or row['mode'] != mode or row['compiled']:
                continue
            other = next((r for r in rows if r['label'] in (peer, f'timm-{peer}')
                          and all(r[k] == row[k] for k in ROW_KEY[:-1])), None)
            if row.get(field) is None or (peer and (other is None or
                                                    not other.get(field))):
                continue
            value = row[field] / (other[field] if peer else 1)
            found.append(dict(
                target=f"{model}{' / ' + peer if peer else ''}, {mode}, {field} "
                       f"{'>=' if at_least else '<='} {goal:g}",
                input=row['input'], precision=row['precision'],
                detector=row['detector'], value=value,
                status='met' if (value >= goal if at_least else value <= goal)
                else 'missed',
                numbers='; '.join(describe(r) for r in (row, other) if r)))
    return found


def describe(row: Dict) -> str:
    """A row's figures in a few words."""
    parts = [f"{row['label']}: {_cell(row['median_ms'])} ms"]
    parts += [f'{_cell(row[k], 0)} {k}' for k in ('kernels', 'max_allocated_mib')
              if row.get(k) is not None]
    if row.get('busy_share') is not None:
        parts.append(f"GPU busy {row['busy_share']:.0%}")
    return ', '.join(parts)


def _cell(value, digits: int = 1) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:,.{digits}f}'
    return str(value).replace('|', '\\|').replace('\n', ' ')


def table_lines(header: Sequence[str], body: Sequence[Sequence[str]],
                right: Sequence[int] = ()) -> List[str]:
    """A Markdown table, the columns numbered in ``right`` aligned right."""
    rule = ''.join('---:|' if i in right else '---|' for i in range(len(header)))
    return (['| ' + ' | '.join(header) + ' |', '|' + rule]
            + ['| ' + ' | '.join(map(str, cells)) + ' |' for cells in body])


def profile_tables(rows: Sequence[Dict], table: str) -> List[str]:
    """Per setting, ``table`` (``regions`` or ``classes``) of the profiled
    rows: each cell the ms (the median step's, by the profiled share), share
    of the time / share of the FLOPs, and the kernels."""
    lines = []
    by_setting: Dict[tuple, List[Dict]] = {}
    for row in (r for r in rows if r.get(table)):
        key = row['mode'], row['input'], row['precision'], row['compiled']
        by_setting.setdefault(key, []).append(row)
    for (mode, size, precision, compiled), chosen in by_setting.items():
        names = sorted(set().union(*(r[table] for r in chosen)),
                       key=lambda n: -max(r[table].get(n, {}).get('ms', 0)
                                          for r in chosen))
        cells = [[name] for name in names]
        for row in chosen:
            total_ms = sum(e['ms'] for e in row[table].values()) or 1
            total_flop = sum(e['gflop'] for e in row[table].values()) or 1
            for line, name in zip(cells, names):
                entry = row[table].get(name)
                line.append('-' if entry is None else
                            f"{entry['ms'] * row['median_ms'] / total_ms:.1f} "
                            f"({entry['ms'] / total_ms:.0%} / "
                            f"{entry['gflop'] / total_flop:.0%}), {entry['kernels']}")
        title = f'{table[:-1].replace("classe", "operator class")}: {mode}, {size}'
        lines += ['', f'### By {title}, {precision}' + ' compiled' * bool(compiled), '']
        lines += table_lines([table[:-2] if table == 'classes' else 'region']
                             + [r['label'] for r in chosen], cells)
    return lines


COLUMNS = (('label', 'model', 0), ('mode', 'mode', 0), ('precision', 'precision', 0),
           ('median_ms', 'median ms', 1), ('iqr', 'IQR ms', 0),
           ('rounds_ms', "rounds' medians", 0), ('cpu_ms', 'fastest CPU ms', 1),
           ('vs_first', 'x first', 3), ('peak_mib', 'peak MiB', 0),
           ('live_peak_mib', 'live peak MiB', 0),
           ('max_allocated_mib', 'max allocated MiB', 0),
           ('max_reserved_mib', 'max reserved MiB', 0),
           ('kernels', 'kernels / step', 0),
           ('busy', 'GPU busy ms (share)', 0), ('compile_s', 'compile s', 1),
           ('gflops', 'GFLOPs', 1), ('largest_batch', 'largest batch', 0),
           ('host_sync', 'host sync', 0), ('status', 'status', 0))


def markdown(data: Dict) -> str:
    """The report's Markdown: the setting, the targets, one table per input,
    the profiles, the tests, and what failed or was skipped."""
    meta, rows = data['meta'], data.get('rows', [])
    lines = ['# Benchmark', '',
             f"{meta.get('device_name')} ({meta.get('device')}); torch "
             f"{meta.get('torch')}, CUDA {meta.get('cuda')}, Python "
             f"{meta.get('python')}; commit {meta.get('commit')}; {meta.get('date')}.",
             '', f"Command: `{meta.get('command')}`."]
    tests = data.get('tests', {})
    if tests.get('ran'):
        counts = ('{passed} passed, {failed} failed, {errors} errors, {skipped} '
                  'skipped in {seconds:.0f} s')
        lines += ['', f"Tests: {tests.get('error') or counts.format(**tests)}."]
    if data.get('targets'):
        lines += ['', '## Targets', '']
        lines += table_lines(
            ('target', 'input', 'precision', 'value', 'status', 'numbers'),
            [[t['target'], t['input'], t['precision'], _cell(t['value'], 2),
              t['status'], t['numbers']] for t in data['targets']])
    for group in dict.fromkeys(map(_group, rows)):
        chosen = [r for r in rows if _group(r) == group]
        shown = [column for column in COLUMNS
                 if any(_value(r, column[0]) is not None for r in chosen)]
        lines += ['', f"## {'Mask R-CNN' if group[0] else 'Backbones'}, {group[1]}"
                  + (f', compiled ({group[2]})' if group[2] else ''), '']
        lines += table_lines([c[1] for c in shown], [[_cell(_value(r, c[0]), c[2])
                                                      for c in shown] for r in chosen])
    for table in ('regions', 'classes'):
        lines += profile_tables(rows, table)
    problems = [f"{r['label']} {r['input']} {r['mode']} {r['precision']}: "
                f"{'; '.join(map(str, r['errors']))}" for r in rows if r['errors']]
    if problems:
        lines += ['', '## Failed or skipped', ''] + [f'- {p}' for p in problems]
    return '\n'.join(lines) + '\n'


def _group(row: Dict) -> tuple:
    """What a table of the report holds: detector or backbone, input, compiled."""
    return row['detector'], row['input'], row['compiled']


def _value(row: Dict, key: str):
    if key == 'iqr':
        return row.get('q1_ms') and f"{row['q1_ms']:.1f}-{row['q3_ms']:.1f}"
    if key == 'rounds_ms':
        return ', '.join(f'{m:.1f}' for m in row['round_medians_ms']) or None
    if key == 'busy':
        return row['busy_ms'] and f"{row['busy_ms']:.1f} ({row['busy_share']:.0%})"
    return row.get(key)


def write_report(data: Dict, out_dir: str) -> Dict:
    """Makes the rows and targets of ``data['records']`` and writes
    ``results.json`` and ``results.md`` in ``out_dir``; returns ``data``."""
    data['rows'] = make_rows(data['records'])
    data['targets'] = evaluate_targets(data['rows'])
    os.makedirs(out_dir, exist_ok=True)
    for name, text in (('results.json', json.dumps(data, indent=1)),
                       ('results.md', markdown(data))):
        with open(os.path.join(out_dir, name + '.partial'), 'w') as file:
            file.write(text)
        os.replace(os.path.join(out_dir, name + '.partial'),
                   os.path.join(out_dir, name))
    return data
