"""Every measured or published figure the pages quote is a record's.

A *record* is one measurement, or one publication, in a YAML file of
``docs/records/``: what was measured, on which date, machine and torch, by
which command, and the figures it gave, each under the name of a *fact*. A
fact (``docs/records/facts.yml``) is one quantity, e.g. the time of mmcv's
compile, with the *phrasings* (regular expressions whose group ``value`` is
the figure) in which the pages state it. ``docs/records/README.md`` says how
to add a record and quote it.

Checks, over the text of the scanned files (:data:`SCANNED`; Markdown,
comments and docstrings alike, read paragraph by paragraph, a paragraph's
lines joined by spaces, table rows kept apart, ``**`` dropped):

- each phrasing of a fact finds the fact on some page;
- each figure a phrasing finds is the figure of a record of that fact;
  a fact with ``range_of`` is the range (lowest–highest) of another fact
  over all its records;
- a measured figure is given with the date of its record (``4 December``,
  ``2–3 December`` or ``2026-12-04``): the date named nearest to it in its
  paragraph (in a table, its row), or, where these name none, a date of
  the paragraph before (a table's caption); a phrasing with a group
  ``date`` names it itself. Where a commit (```74cce13```) is named
  nearest to it, it is the record's;
- on the pages of :data:`EVERY_FIGURE_QUOTED`, every time, disk size and
  three-decimal score is a figure a phrasing found, unless
  :data:`NOT_MEASURED` lists it;
- each record says what, when, where and how; each figure it holds is a
  quoted string of a registered fact; each fact has a record;
- the structured copies of the published figures (the metafiles' ``Paper
  Results`` and the ``Published`` columns of the configs' READMEs) are the
  published records' figures.
"""
import datetime
import glob
import os.path as osp
import re
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import pytest
import yaml

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
RECORDS = osp.join(REPO, 'docs', 'records')
FACTS_FILE = 'facts.yml'
#: The files whose text is searched for the facts' phrasings.
SCANNED = ('README.md', 'CHANGELOG.md', 'Makefile', 'docs/**/*.md',
           'configs/**/*.md', 'configs/**/*.py', 'configs/**/*.yml',
           'tools/**/*.py', 'tools/**/*.sh', 'mmsoft/**/*.py',
           'requirements/*.txt')
#: The pages where every time, disk size and three-decimal score must be a
#: quoted record (see :data:`FIGURE`).
EVERY_FIGURE_QUOTED = ('README.md', 'docs/get_started.md', 'docs/testing.md',
                       'tools/build_mmcv_wheel.sh', 'configs/demo/*.py')
#: What such a page may state that is not a measurement: (page, text) ->
#: what it is.
NOT_MEASURED = {
    ('docs/testing.md', '30 minutes'): 'the limit a cold run is held to',
}
#: A time, a disk size or a score of three decimals (mAP; not one in a
#: Python tuple, as Adam's betas).
FIGURE = re.compile(
    r'(?<![\w.])\d+(?:[.,]\d+)*(?: ?(?:min|minutes|s|seconds|h|hours|GiB|GB|MiB|MB)'
    r'(?![\w/]))|(?<![\w.(])(?<!, )0\.\d{3}(?![\d])')
#: The keys every record has, by kind.
RECORD_KEYS = {'measured': ('what', 'date', 'machine', 'torch', 'command',
                            'figures'),
               'published': ('what', 'source', 'figures')}
MONTHS = ('January', 'February', 'March', 'April', 'May', 'June', 'July',
          'August', 'September', 'October', 'November', 'December')
DATES = re.compile(r'(?<!\d)(\d{1,2})(?:[–-](\d{1,2}))? (' + '|'.join(MONTHS) +
                   r')|(\d{4})-(\d{2})-(\d{2})')
COMMITS = re.compile(r'`([0-9a-f]{7,40})`')
#: The published figures' copies: a metafile's metric -> the fact's last word.
METRICS = {'box AP': 'box-ap', 'mask AP': 'mask-ap', 'mIoU': 'miou'}


class Record(NamedTuple):
    """One measurement or publication (a file of ``docs/records/``)."""
    name: str  #: the file's name without ``.yml``
    date: Optional[datetime.date]  #: None for a publication
    figures: Dict[str, Tuple[str, ...]]  #: fact -> its spellings, normalised
    commit: Optional[str] = None  #: the code measured, where it is known


class Fact(NamedTuple):
    """One quantity and the phrasings that state it."""
    name: str
    patterns: Tuple[re.Pattern, ...]
    range_of: Optional[str] = None  #: a fact whose records' range this is


class Mention(NamedTuple):
    """A figure a fact's phrasing found."""
    fact: str
    pattern: int  #: index of the phrasing in the fact's
    value: str  #: normalised
    date: Optional[str]  #: the phrasing's group ``date``, if it has one
    path: str  #: relative to the repository
    line: int  #: of the paragraph
    paragraph: str  #: its paragraph's text
    previous: str  #: the text of the paragraph before
    span: Tuple[int, int]  #: of the value in the paragraph's text

    def __str__(self) -> str:
        return f'{self.path}:{self.line}'


def normalise(value: str) -> str:
    """A figure as compared: no thousands commas, an en dash between
    numbers, single spaces."""
    value = re.sub(r'(?<=\d),(?=\d{3}\b)', '', str(value))
    value = re.sub(r'(?<=\d) ?[-–] ?(?=\d)', '–', value)
    return ' '.join(value.split())


def load_records(folder: str = RECORDS) -> Tuple[Dict[str, Record], List[str]]:
    """The records of ``folder`` by name, and what is wrong with them."""
    records, problems = {}, []
    for path in sorted(glob.glob(osp.join(folder, '*.yml'))):
        name = osp.basename(path)[:-len('.yml')]
        if name + '.yml' == FACTS_FILE:
            continue
        with open(path, encoding='utf-8') as f:
            data = yaml.safe_load(f) or {}
        kind = 'published' if 'source' in data else 'measured'
        missing = [key for key in RECORD_KEYS[kind] if not data.get(key)]
        if missing:
            problems.append(f'{name}.yml: a {kind} record needs {missing}')
            continue
        figures = {}
        for fact, value in data['figures'].items():
            spellings = value if isinstance(value, list) else [value]
            if not all(isinstance(s, str) for s in spellings):
                problems.append(f'{name}.yml: {fact}: {value!r}; write each figure '
                                f'as a quoted string, as the pages write it')
                continue
            figures[fact] = tuple(normalise(s) for s in spellings)
        date = (datetime.date.fromisoformat(str(data['date']))
                if kind == 'measured' else None)
        commit = str(data['commit']) if data.get('commit') else None
        records[name] = Record(name, date, figures, commit)
    return records, problems


def load_facts(folder: str = RECORDS) -> Dict[str, Fact]:
    """The facts of ``folder/facts.yml`` by name."""
    with open(osp.join(folder, FACTS_FILE), encoding='utf-8') as f:
        data = yaml.safe_load(f)
    facts = {}
    for name, entry in data.items():
        patterns = tuple(re.compile(p, re.MULTILINE)
                         for p in entry.get('phrasings') or ())
        facts[name] = Fact(name, patterns, entry.get('range_of'))
    return facts


def scanned_files(patterns: Sequence[str] = SCANNED, root: str = REPO) -> List[str]:
    """The files, relative to ``root``, that ``patterns`` select, but the
    records themselves."""
    paths = set()
    for pattern in patterns:
        found = glob.glob(osp.join(root, pattern), recursive=True)
        if not found:
            raise ValueError(f'{pattern!r} selects no file under {root}')
        paths.update(osp.relpath(p, root) for p in found if osp.isfile(p))
    return sorted(p for p in paths if not p.startswith('docs/records/'))


def paragraphs(path: str, root: str = REPO) -> Iterator[Tuple[int, str]]:
    """``(first line, text)`` of each paragraph of a file, normalised as the
    module's docstring says; comment markers of code files dropped."""
    with open(osp.join(root, path), encoding='utf-8') as f:
        lines = f.read().splitlines()
    code = not path.endswith('.md')
    start, block = 0, []
    for number, line in enumerate(lines + [''], 1):
        if code:
            line = re.sub(r'^\s*#+ ?', '', line)
        if line.strip():
            if not block:
                start = number
            block.append(line)
            continue
        if block:
            text = block[0].strip()
            for row in block[1:]:
                text += ('\n' if row.lstrip().startswith('|') else ' ') + row.strip()
            yield start, text.replace('**', '')
        block = []


def find_mentions(facts: Dict[str, Fact], files: Sequence[str],
                  root: str = REPO) -> List[Mention]:
    """Every figure the facts' phrasings find in ``files``."""
    mentions = []
    for path in files:
        previous = ''
        for line, text in paragraphs(path, root):
            for fact in facts.values():
                for index, pattern in enumerate(fact.patterns):
                    for match in pattern.finditer(text):
                        groups = match.groupdict()
                        mentions.append(Mention(
                            fact.name, index, normalise(match.group('value')),
                            groups.get('date'), path, line, text, previous,
                            match.span('value')))
            previous = text
    return mentions


def named_dates(text: str, year: int) -> List[Tuple[int, set]]:
    """Where ``text`` names a date, and which (a range ``2–3 December``
    names both)."""
    found = []
    for match in DATES.finditer(text):
        first, last, month, iso_y, iso_m, iso_d = match.groups()
        if iso_y:
            dates = {datetime.date(int(iso_y), int(iso_m), int(iso_d))}
        else:
            dates = {datetime.date(year, MONTHS.index(month) + 1, day)
                     for day in range(int(first), int(last or first) + 1)}
        found.append((match.start(), dates))
    return found


def named_commits(text: str) -> List[Tuple[int, set]]:
    """Where ``text`` names a commit (in backticks), and which."""
    return [(m.start(), {m.group(1)}) for m in COMMITS.finditer(text)]


def nearest(mention: Mention, find) -> set:
    """What ``find`` (a text -> ``[(position, set)]``) names nearest to the
    mention's figure in its paragraph (in a table, its row); where that
    names nothing, all that the paragraph before (a table's caption) names."""
    start, end = mention.span
    text = mention.paragraph
    if '\n' in text:  # a table: the figure's row
        offset = text.rfind('\n', 0, start) + 1
        text = text[offset:text.find('\n', end) % (len(text) + 1)]
        start, end = start - offset, end - offset
    named = find(text)
    if not named:
        return set().union(*(found for _, found in find(mention.previous)))
    distance = min(min(abs(at - start), abs(at - end)) for at, _ in named)
    return set().union(*(found for at, found in named
                         if min(abs(at - start), abs(at - end)) == distance))


def given_with(mention: Mention, record: Record) -> bool:
    """Whether the mention gives its figure with the record's date (its own
    group ``date``, else the date named nearest to it) and, where a commit
    is named nearest to it, with the record's commit."""
    year = record.date.year
    if mention.date is not None:
        dates = set().union(*(d for _, d in named_dates(mention.date, year)))
    else:
        dates = nearest(mention, lambda text: named_dates(text, year))
    commits = nearest(mention, named_commits)
    return record.date in dates and (
        not commits or not record.commit or
        any(record.commit.startswith(c) or c.startswith(record.commit)
            for c in commits))


def _number(value: str) -> float:
    return float(re.match(r'[\d.]+', value).group())


def range_value(fact: Fact, records: Dict[str, Record]) -> Optional[str]:
    """``lowest–highest`` of ``fact.range_of`` over its records."""
    values = [record.figures[fact.range_of][0] for record in records.values()
              if fact.range_of in record.figures]
    if not values:
        return None
    return normalise(f'{min(values, key=_number)}–{max(values, key=_number)}')


def check_mentions(facts: Dict[str, Fact], records: Dict[str, Record],
                   mentions: List[Mention]) -> List[str]:
    """What is wrong with the figures the pages state."""
    problems = []
    for mention in mentions:
        fact = facts[mention.fact]
        if fact.range_of:
            expected = range_value(fact, records)
            if mention.value != expected:
                problems.append(f'{mention}: {fact.name} is {mention.value!r}; the '
                                f'records of {fact.range_of} range over {expected!r}')
            continue
        holding = [r for r in records.values()
                   if mention.value in r.figures.get(fact.name, ())]
        if not holding:
            recorded = {r.name: r.figures[fact.name][0] for r in records.values()
                        if fact.name in r.figures}
            problems.append(f'{mention}: {fact.name} is {mention.value!r}, which no '
                            f'record holds; the records: {recorded}')
            continue
        measured = [r for r in holding if r.date]
        if not measured:
            continue  # published
        if not any(given_with(mention, r) for r in measured):
            problems.append(
                f'{mention}: {fact.name} {mention.value!r} is the figure of '
                f'{[(r.name, r.date.strftime("%-d %B"), r.commit) for r in measured]}; '
                f'it is not given with that date (and commit) nearest to it')
    return problems


def unquoted_figures(files: Sequence[str], mentions: List[Mention],
                     root: str = REPO, not_measured=None) -> List[str]:
    """Times, disk sizes and scores of ``files`` that no phrasing found."""
    not_measured = NOT_MEASURED if not_measured is None else not_measured
    found = {}
    for mention in mentions:
        found.setdefault((mention.path, mention.line), []).append(mention.span)
    problems = []
    for path in files:
        for line, text in paragraphs(path, root):
            spans = found.get((path, line), [])
            for match in FIGURE.finditer(text):
                if (path, match.group()) in not_measured:
                    continue
                if not any(start <= match.start() and match.end() <= end
                           for start, end in spans):
                    near = text[max(0, match.start() - 60):match.end() + 20]
                    problems.append(
                        f'{path}:{line}: {match.group()!r} in "...{near}..."')
    return problems


def unused_phrasings(facts: Dict[str, Fact], mentions: List[Mention]) -> List[str]:
    """The phrasings that find nothing."""
    used = {(m.fact, m.pattern) for m in mentions}
    return [f'{fact.name}: {pattern.pattern}' for fact in facts.values()
            for index, pattern in enumerate(fact.patterns)
            if (fact.name, index) not in used]


def headline_files(root: str = REPO) -> List[str]:
    """The files of :data:`EVERY_FIGURE_QUOTED`."""
    return scanned_files(EVERY_FIGURE_QUOTED, root)


@pytest.fixture(scope='module')
def registry():
    facts = load_facts()
    records, problems = load_records()
    return facts, records, problems, find_mentions(facts, scanned_files())


def test_records_say_what_when_where_and_how(registry):
    facts, records, problems, _ = registry
    assert not problems, '\n'.join(problems)
    assert records
    unknown = [f'{r.name}.yml: {fact}' for r in records.values()
               for fact in r.figures if fact not in facts]
    assert not unknown, f'figures of facts that facts.yml lacks: {unknown}'
    without = [fact.name for fact in facts.values()
               if not any((fact.range_of or fact.name) in r.figures
                          for r in records.values())]
    assert not without, f'facts without a record: {without}'
    for fact in facts.values():
        for pattern in fact.patterns:
            assert 'value' in pattern.groupindex, f'{fact.name}: {pattern.pattern}'


def test_every_phrasing_finds_its_fact(registry):
    facts, _, _, mentions = registry
    unused = unused_phrasings(facts, mentions)
    assert not unused, 'phrasings that find nothing on the pages:\n' + '\n'.join(unused)


def test_pages_quote_the_records(registry):
    facts, records, _, mentions = registry
    problems = check_mentions(facts, records, mentions)
    assert not problems, '\n'.join(problems)


def test_every_figure_of_the_headline_pages_is_a_record(registry):
    facts, _, _, mentions = registry
    problems = unquoted_figures(headline_files(), mentions)
    assert not problems, (
        'figures that no phrasing of docs/records/facts.yml finds (record them '
        'and add a phrasing, or drop them):\n' + '\n'.join(problems))


def test_not_measured_entries_are_on_their_pages():
    for path, text in NOT_MEASURED:
        assert any(text in paragraph for _, paragraph in paragraphs(path)), \
            (path, text)


def _published(records: Dict[str, Record]) -> Dict[str, str]:
    return {fact: spellings[0] for record in records.values() if record.date is None
            for fact, spellings in record.figures.items()}


def _zoo_models() -> Iterator[Tuple[str, dict]]:
    """``(metafile, model)`` of every model of the metafiles."""
    for path in sorted(glob.glob(osp.join(REPO, 'configs', '*', 'metafile.yml'))):
        with open(path, encoding='utf-8') as f:
            for model in yaml.safe_load(f)['Models']:
                yield osp.relpath(path, REPO), model


def published_fact(model: dict, metric: str) -> str:
    """The fact of a metafile model's published metric, e.g.
    ``published.soft++-tiny.mask-rcnn.box-ap``."""
    backbone, task = model['Metadata']['Architecture'][:2]
    slug = re.sub(r'[^a-z0-9+]+', '-', task.lower()).strip('-')
    return f'published.{backbone.lower()}.{slug}.{METRICS[metric]}'


def test_metafiles_paper_results_are_the_published_records(registry):
    _, records, _, _ = registry
    published = _published(records)
    checked = 0
    for metafile, model in _zoo_models():
        for result in model['Metadata'].get('Paper Results', []):
            for metric, value in result['Metrics'].items():
                fact = published_fact(model, metric)
                assert published.get(fact) == normalise(str(value)), (
                    f'{metafile}: {model["Name"]} {metric} {value}; '
                    f'{fact}: {published.get(fact)}')
                checked += 1
    assert checked >= 10, checked


def markdown_tables(text: str) -> Iterator[List[Dict[str, str]]]:
    """The tables of a Markdown text, each a list of rows (header -> cell)."""
    for block in re.findall(r'(?:^\|.*\|\n)+', text + '\n', re.MULTILINE):
        rows = [[cell.strip() for cell in line.strip().strip('|').split('|')]
                for line in block.splitlines()]
        if len(rows) > 2 and set(''.join(rows[1])) <= set('-: '):
            yield [dict(zip(rows[0], row)) for row in rows[2:]]


def test_config_readmes_published_columns_are_the_published_records(registry):
    _, records, _, _ = registry
    published = _published(records)
    models = {osp.basename(model['Config']): model for _, model in _zoo_models()}
    checked = 0
    for path in glob.glob(osp.join(REPO, 'configs', '*', 'README.md')):
        with open(path, encoding='utf-8') as f:
            tables = list(markdown_tables(f.read()))
        for row in (row for table in tables for row in table):
            config = re.match(r'\[([^\]]+\.py)\]', row.get('Config', ''))
            if not config:
                continue
            model = models[config.group(1)]
            for column, cell in row.items():
                metric = column[len('Published '):]
                if not column.startswith('Published ') or metric not in METRICS:
                    continue
                fact = published_fact(model, metric)
                paper = [m for r in model['Metadata'].get('Paper Results', [])
                         for m in r['Metrics']]
                expected = published.get(fact) if metric in paper else '–'
                assert normalise(cell) == expected, (
                    f'{osp.relpath(path, REPO)}: {config.group(1)} {column} {cell}; '
                    f'{fact}: {expected}')
                checked += 1
    assert checked >= 20, checked


def test_the_checks_bite(tmp_path):
    """A wrong figure, a missing or wrong date or commit, a wrong range, an
    unrecorded figure, an unused phrasing and an incomplete record are each
    reported."""
    folder = tmp_path / 'records'
    folder.mkdir()
    (folder / FACTS_FILE).write_text(
        "x.time:\n  phrasings: ['took (?P<value>\\d+ min \\d+ s)']\n"
        "x.score:\n  phrasings: ['score (?P<value>0\\.\\d{3})(?![\\d–])']\n"
        "x.score.range:\n  range_of: x.score\n"
        "  phrasings: ['spans (?P<value>0\\.\\d{3}–0\\.\\d{3})']\n"
        "x.unused:\n  phrasings: ['never (?P<value>\\d+ s)']\n")
    measured = 'what: w\nmachine: m\ntorch: t\ncommand: c\n'
    (folder / 'a.yml').write_text(
        measured + "date: 2026-12-04\ncommit: abc1234\n"
        "figures: {x.time: '1 min 2 s', x.score: '0.300'}\n")
    (folder / 'b.yml').write_text(
        measured + "date: 2026-12-03\nfigures: {x.score: '0.400'}\n")
    (folder / 'c.yml').write_text(
        measured + 'date: 2026-12-03\nfigures: {x.time: 0.5}\n')
    (folder / 'd.yml').write_text(
        "what: w\ndate: 2026-12-03\nfigures: {x.score: '0.1'}\n")
    (tmp_path / 'page.md').write_text(
        'It took 1 min 2 s on 4 December, at `abc1234`.\n\n'
        'It took 1 min 3 s on 4 December.\n\n'
        'It took 1 min 2 s on 3 December.\n\n'
        'Run `def5678` on 4 December took 1 min 2 s.\n\n'
        'Its score 0.400 (3 December); the score spans 0.300–0.400.\n\n'
        '| run | score |\n|---|---|\n| 4 December | score 0.300 |\n\n'
        'Elsewhere the score spans 0.300–0.500, in about 9 minutes.\n')
    facts = load_facts(str(folder))
    records, problems = load_records(str(folder))
    assert sorted(records) == ['a', 'b', 'c']
    assert len(problems) == 2, problems
    assert "c.yml: x.time: 0.5; write each figure as a quoted string" in problems[0]
    assert "d.yml: a measured record needs ['machine', 'torch', 'command']" \
        in problems[1]
    mentions = find_mentions(facts, ['page.md'], str(tmp_path))
    problems = check_mentions(facts, records, mentions)
    assert [p.split(':')[1] for p in problems] == ['3', '5', '7', '15'], problems
    assert "x.time is '1 min 3 s', which no record holds" in problems[0]
    assert "('a', '4 December', 'abc1234')]; it is not given" in problems[1]
    assert "('a', '4 December', 'abc1234')]; it is not given" in problems[2]
    assert "x.score.range is '0.300–0.500'; the records of x.score range over " \
        "'0.300–0.400'" in problems[3]
    unquoted = unquoted_figures(['page.md'], mentions, str(tmp_path), {})
    assert len(unquoted) == 1 and "page.md:15: '9 minutes'" in unquoted[0], unquoted
    assert unused_phrasings(facts, mentions) == ['x.unused: never (?P<value>\\d+ s)']
