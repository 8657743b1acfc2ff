"""The commands, recipes and links of README.md and of the docs pages work as
written.

The pages are ``README.md`` and every ``docs/**/*.md``. Their fenced
```` ```bash ```` blocks are read command by command (a backslash at the
end of a line continues the command; ``&&``, ``||``, ``;`` and ``|``
separate commands; ``#`` starts a comment; leading ``NAME=value`` words
set the environment and are not part of the command).

Words that stand for the reader's own values are *placeholders*: an upper-case
word (``CONFIG``, ``CKPT``, ``KEY=VALUE``), a word with ``...``
(``work_dirs/.../epoch_N.pth``) or with a single upper-case letter for a
number (``epoch_N.pth``). A command with a placeholder or with ``[``/``]``
(optional parts) is a *synopsis*: its scripts, files and flags are checked,
it is not run.

Checks, on every page:

- every relative link (``[text](path)``, ``![alt](path)``, ``<img src>``)
  outside code blocks names a file or folder of the repository, and its
  ``#anchor``, if any, a heading of the Markdown page it points to; every
  repository path in inline code exists, inside the repository (these two
  on the configs' READMEs and the changelog too);
- every script and file under ``tools/``, ``configs/`` and ``requirements/``
  that a command names exists, placeholders excepted;
- every ``make`` target a command names is a rule of the Makefile;
- every ``--flag`` a command gives a repository tool is in that tool's
  ``--help``; the shell launchers' flags are checked against the Python tool
  they forward their options to, a launcher that forwards none takes none;
- on each page, ``python tools/...`` commands come after a command that
  enters an environment (``. .venv/bin/activate``, or another
  ``.../bin/activate``);
- the README has the section "Quick start (two commands)";
- the commands of "Train, test, scale out" (one section of one page) that
  are not synopses run, in order, in a scratch directory (``tools/`` and
  ``configs/`` linked into it) with options appended that shrink them to
  seconds: a few 96x96 images, one iteration per epoch. ``python`` is the
  interpreter running the tests, as in an activated environment; the shell
  launchers run with ``PYTHON`` unset and without that environment on
  ``PATH``, where ``python`` is a stand-in that fails, so they have to
  find the checkout's ``.venv`` by themselves (when the tests run in
  another environment, the launchers get ``PYTHON`` and that check is
  skipped). The scripts in :data:`NOT_RUN` are left out there, to keep the
  run short: other tests run them with the same config;
- the table of "Where things live" names existing paths and every package
  of ``mmsoft``.

*Snippets* are the ```` ```python ```` blocks right after a marker line
``<!-- snippet: NAME -->``: every Python block of the README is one (or a
recipe), and each runs in a test where its framework is installed
(:data:`SNIPPETS`; one that reads a download gets a stand-in, and the text
before it names the file), or, the config, is compared with the shipped
config it stands for.

*Recipes* are the fenced ```` ```python ```` blocks right after a marker
line ``<!-- recipe: NAME -->`` (an HTML comment, invisible on the rendered
page). :data:`RECIPES` names every recipe the pages must have: one that is
missing, unmarked or marked twice fails. Each recipe names its model in one
line, ``NAME = 'soft_plus_plus_tiny'``, and leaves ``loss`` (the training
step's) and ``predictions``; it runs, in this process, once with each model
of :data:`RECIPE_MODELS` in that line (tests marked ``frameworks``; skipped
where its framework is not installed). The test checks that the model it
trained is that model, that one optimizer step moved its parameters, that
the loss is finite, and the predictions' structure and shapes.
"""
import contextlib
import functools
import glob
import importlib.util
import inspect
import io
import os
import os.path as osp
import re
import runpy
import shlex
import socket
import stat
import subprocess
import sys
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
README = osp.join(REPO, 'README.md')
#: The pages whose commands and links are checked: the README and the docs.
PAGES = [README] + sorted(
    glob.glob(osp.join(REPO, 'docs', '**', '*.md'), recursive=True))
#: The pages whose relative links and repository paths are checked: the
#: pages, the configs' READMEs and the changelog.
DOC_PAGES = PAGES + sorted(glob.glob(osp.join(REPO, 'configs', '**', '*.md'),
                                     recursive=True)) + [osp.join(REPO, 'CHANGELOG.md')]
QUICK_START = 'Quick start (two commands)'
LAYOUT_SECTION = 'Where things live'
VENV = osp.join(REPO, '.venv')
RUN_SECTION = 'Train, test, scale out'
#: Top-level folders of the repository whose files a command may name.
CHECKED_DIRS = ('tools', 'configs', 'requirements')
#: The command that enters the environment the quick start installs.
ACTIVATE = ('.', '.venv/bin/activate')
SEPARATORS = {'&&', '||', ';', '|'}
SHELLS = ('bash', 'sh')
PYTHONS = ('python', 'python3')
#: Seconds one command of the run section may take.
RUN_TIMEOUT = 300
#: Scripts whose commands in the run section are checked but not run, with
#: the test that runs them instead (each start of the tools costs about 10 s
#: of imports on 2 cores).
NOT_RUN = {
    'tools/train.py': 'tests/test_tools.py trains the demo detector with it',
    'tools/test.py': 'tests/test_tools.py tests the demo detector with it, '
                     '--show-dir and --out included',
}


def _load_tool_helpers():
    """``tests/test_tools.py`` as a module, for its ``tiny_options``."""
    spec = importlib.util.spec_from_file_location(
        'mmsoft_test_tools_helpers', osp.join(REPO, 'tests', 'test_tools.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Command(NamedTuple):
    """One command of a bash block of a page."""
    section: str  #: the ``## `` heading it is under
    text: str  #: as written (continuation lines joined)
    argv: List[str]  #: its words, without comments and environment settings
    page: str = 'README.md'  #: the page, relative to the repository

    def __str__(self) -> str:
        return f'[{self.page}: {self.section}] {self.text}'


def _words(line: str) -> List[List[str]]:
    """The commands of one logical line, each as a list of words."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for word in lexer:
        if word in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    out = []
    for argv in commands:
        while argv and re.fullmatch(r'[A-Za-z_]\w*=\S*', argv[0]):
            argv = argv[1:]  # NAME=value: environment of the command
        if argv:
            out.append(argv)
    return out


def parse_readme(path: str = README) -> List[Command]:
    """Every command of the ``bash`` blocks of ``path``, in document order."""
    page = osp.relpath(path, REPO)
    commands, section, block = [], '', None
    with open(path, encoding='utf-8') as f:
        lines = f.read().splitlines()
    for line in lines:
        if block is None:
            if line.startswith('## '):
                section = line[3:].strip()
            elif line.strip() == '```bash':
                block = []
            continue
        if line.strip() == '```':
            text = '\n'.join(block).replace('\\\n', ' ')
            for logical in text.splitlines():
                for argv in _words(logical):
                    commands.append(
                        Command(section, logical.strip(), argv, page))
            block = None
        else:
            block.append(line)
    return commands


def is_placeholder(word: str) -> bool:
    """Whether a word stands for the reader's own value (see the module doc)."""
    word = word.strip('[]')
    return ('...' in word
            or any(re.fullmatch(r'[A-Z][A-Z0-9_]*', part)
                   for part in word.split('='))
            or bool(re.search(r'(?<=[_/-])[A-Z](?=[._/-]|$)', word)))


def is_synopsis(command: Command) -> bool:
    """Whether the command is a usage line rather than one to paste."""
    return any('[' in w or ']' in w or is_placeholder(w) for w in command.argv)


def flags(command: Command) -> List[str]:
    """The ``--flags`` the command shows (``[--a [B]]`` and ``--a=b`` too)."""
    out = []
    for word in command.argv:
        word = word.strip('[]')
        if word.startswith('--') and len(word) > 2:
            out.append(word.split('=', 1)[0])
    return out


def named_files(command: Command) -> List[str]:
    """Paths under :data:`CHECKED_DIRS` the command names, placeholders
    excepted."""
    out = []
    for word in command.argv:
        for part in word.strip('[]').split('='):
            if (part.split('/', 1)[0] in CHECKED_DIRS and '/' in part
                    and not is_placeholder(part)):
                out.append(part)
    return out


def check_selections(commands: List[Command], not_run=None,
                     checked_dirs=CHECKED_DIRS) -> None:
    """Checks that the lists that select commands and paths select something.

    Args:
        commands (list[Command]): The commands of the pages.
        not_run (dict, optional): Scripts left out of the run section's run.
            Default: :data:`NOT_RUN`.
        checked_dirs (Sequence[str]): Folders whose files the commands'
            paths are checked in. Default: :data:`CHECKED_DIRS`.

    Raises:
        ValueError: When a script of ``not_run`` is not run by a runnable
            command of the run section, or a folder of ``checked_dirs`` does
            not exist or holds no path that a command names.
    """
    not_run = NOT_RUN if not_run is None else not_run
    runnable = {repo_tool(c) for c in commands
                if c.section == RUN_SECTION and not is_synopsis(c)} - {None}
    unused = sorted(set(not_run) - runnable)
    if unused:
        raise ValueError(f'not_run names {unused}, which no runnable command of '
                         f'"{RUN_SECTION}" runs; expected scripts among '
                         f'{sorted(runnable)}.')
    named = {path.split('/')[0] for c in commands for path in named_files(c)}
    for folder in checked_dirs:
        if not osp.isdir(osp.join(REPO, folder)) or folder not in named:
            raise ValueError(f'checked_dirs names {folder!r}, which is not a '
                             'folder of the repository whose paths the commands '
                             f'name; folders they name: {sorted(named)}.')


def _join_continuations(text: str) -> str:
    """Shell text with backslash-continued lines joined."""
    return re.sub(r'\\\n\s*', ' ', text)


def forwarded_tool(script: str) -> Optional[str]:
    """The Python tool (``tools/<name>.py``) a shell launcher hands its extra
    options (``"$@"``) to; None when it forwards none."""
    with open(osp.join(REPO, script)) as f:
        text = _join_continuations(f.read())
    for line in text.splitlines():
        if '"$@"' in line and not line.lstrip().startswith('#'):
            tools = re.findall(r'(?:\$TOOLS_DIR|tools)/(\w+\.py)', line)
            if tools:
                return f'tools/{tools[-1]}'
    return None


def repo_tool(command: Command) -> Optional[str]:
    """The repository script a command runs (``tools/x.py`` or ``tools/x.sh``),
    or None (``make``, ``pip``, ...)."""
    argv = command.argv
    if len(argv) > 1 and argv[0] in PYTHONS + SHELLS and \
            argv[1].startswith('tools/'):
        return argv[1]
    return None


def python_tool(command: Command) -> Optional[str]:
    """The repository tool whose options the command passes: a Python tool,
    the one a shell launcher hands its options to, or a shell tool that
    parses its own (it answers ``--help``)."""
    tool = repo_tool(command)
    if tool and tool.endswith('.sh') and osp.isfile(osp.join(REPO, tool)):
        with open(osp.join(REPO, tool)) as f:
            parses_options = '--help' in f.read()
        return forwarded_tool(tool) or (tool if parses_options else None)
    return tool


def make_targets() -> set:
    """The targets of the Makefile's rules (special ones like ``.PHONY``
    excepted)."""
    with open(osp.join(REPO, 'Makefile')) as f:
        text = f.read()
    targets = set()
    for names in re.findall(r'^([A-Za-z0-9_.-][^:=#\n]*?)[ \t]*::?(?!=)', text,
                            re.M):
        targets.update(n for n in names.split() if not n.startswith('.'))
    return targets


@functools.lru_cache(maxsize=None)
def tool_help(tool: str, subcommand: Optional[str] = None) -> str:
    """What ``python <tool> [subcommand] --help`` prints, run in this process
    (the tools share their imports: a process each would import torch and
    OpenMMLab again, about 10 s a tool); ``bash <tool> --help`` for a shell
    tool."""
    if tool.endswith('.sh'):
        result = subprocess.run(['bash', tool, '--help'], capture_output=True,
                                text=True, timeout=120, env=_base_env(), cwd=REPO)
        assert result.returncode == 0, \
            f'{tool} --help failed:\n{result.stdout}{result.stderr}'
        return result.stdout
    argv, path, out = sys.argv, sys.path[:], io.StringIO()
    sys.argv = [tool, *filter(None, [subcommand]), '--help']
    sys.path.insert(0, osp.dirname(osp.join(REPO, tool)))  # as python TOOL has it
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            runpy.run_path(osp.join(REPO, tool), run_name='__main__')
    finally:
        sys.argv, sys.path[:] = argv, path
    assert done.value.code in (0, None), f'{tool} --help failed:\n{out.getvalue()}'
    return out.getvalue()


def tool_options(tool: str, subcommand: Optional[str] = None) -> frozenset:
    """The ``--options`` that the tool's (subcommand's) help lists."""
    return frozenset(re.findall(r'(?<![\w-])(--[A-Za-z][\w-]*)',
                                tool_help(tool, subcommand)))


def subcommands(tool: str) -> frozenset:
    """The subcommands of a Python tool that has them (argparse's ``{a,b}``
    in the usage line of its help)."""
    usage = tool_help(tool).split('\n\n', 1)[0]
    return frozenset(word for group in re.findall(r'\{([\w,-]+)\}', usage)
                     for word in group.split(','))


def _base_env() -> Dict[str, str]:
    """Subprocess environment: mmsoft importable, one thread per process."""
    env = dict(os.environ)
    env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
    env.setdefault('OMP_NUM_THREADS', '1')
    return env


def parse_pages(pages: List[str] = PAGES) -> List[Command]:
    """Every command of every page, page by page in document order."""
    return [command for path in pages for command in parse_readme(path)]


def is_activation(command: Command) -> bool:
    """Whether the command enters an environment (``. X/bin/activate``)."""
    argv = command.argv
    return len(argv) == 2 and argv[0] in ('.', 'source') and \
        argv[1].endswith('bin/activate')


# ------------------------------------------------------------------ links ---
def _without_code_blocks(text: str) -> str:
    """Markdown text with its fenced code blocks blanked (lines kept)."""
    out, fence = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if fence is None and re.match(r'(```|~~~)', stripped):
            fence = stripped[:3]
            out.append('')
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            out.append('')
        else:
            out.append(line)
    return '\n'.join(out)


def links(path: str) -> List[str]:
    """The link targets of a Markdown page (``[..](x)``, ``![..](x)``,
    ``<img src="x">``), code blocks excepted."""
    with open(path, encoding='utf-8') as f:
        text = _without_code_blocks(f.read())
    targets = re.findall(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)', text)
    targets += re.findall(r'<img\s[^>]*src="([^"]+)"', text)
    return targets


def is_external(target: str) -> bool:
    """Whether a link leaves the repository (``https:``, ``mailto:``...)."""
    return bool(re.match(r'[A-Za-z][A-Za-z0-9+.-]*:', target))


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces
    as ``-``."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading.strip())
    text = re.sub(r'[^\w\- ]', '', text.lower())
    return text.replace(' ', '-')


@functools.lru_cache(maxsize=None)
def anchors(path: str) -> frozenset:
    """The anchors of the headings of a Markdown page (duplicates as
    ``name-1``, ``name-2``, as GitHub numbers them)."""
    with open(path, encoding='utf-8') as f:
        text = _without_code_blocks(f.read())
    seen: Dict[str, int] = {}
    out = set()
    for heading in re.findall(r'^#{1,6}\s+(.+?)\s*#*\s*$', text, re.M):
        anchor = heading_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        out.add(anchor if count == 0 else f'{anchor}-{count}')
    return frozenset(out)


def broken_link(page: str, target: str) -> Optional[str]:
    """Why a relative link of ``page`` is broken; None when it works."""
    path, _, anchor = target.partition('#')
    resolved = osp.normpath(osp.join(osp.dirname(page), path)) if path \
        else page
    if not osp.exists(resolved):
        return f'{osp.relpath(resolved, REPO)} does not exist'
    if anchor and resolved.endswith('.md') and \
            anchor.lower() not in anchors(resolved):
        return (f'{osp.relpath(resolved, REPO)} has no heading with anchor '
                f'#{anchor}')
    return None


COMMANDS = parse_pages()


# ----------------------------------------------------------- static checks ---
def test_readme_has_the_documented_commands():
    readme_sections = {c.section for c in COMMANDS if c.page == 'README.md'}
    assert QUICK_START in readme_sections, readme_sections
    assert ['make', 'demo'] in [c.argv for c in COMMANDS
                                if c.section == QUICK_START]
    assert ['make', 'test'] in [c.argv for c in COMMANDS
                                if c.section == QUICK_START]
    run_pages = {c.page for c in COMMANDS if c.section == RUN_SECTION}
    assert len(run_pages) == 1, \
        f'"{RUN_SECTION}" should be one section of one page: {run_pages}'
    runnable = [c for c in COMMANDS if c.section == RUN_SECTION
                and not is_synopsis(c) and repo_tool(c)]
    assert len(runnable) >= 4, runnable


def test_placeholders():
    for word in ('CONFIG', 'CKPT]]', 'KEY=VALUE', 'work_dirs/.../epoch_N.pth',
                 'epoch_N.pth', '[--resume'):
        assert is_placeholder(word) or '[' in word, word
    for word in ('configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py', 'coco',
                 'work_dirs/mask-rcnn_soft-tiny_fpn_demo/epoch_8.pth', '--amp'):
        assert not is_placeholder(word), word


def test_selections_select_something():
    check_selections(COMMANDS)
    with pytest.raises(ValueError, match=r"not_run names \['tools/train_old.py'\]"):
        check_selections(COMMANDS, not_run={'tools/train_old.py': 'renamed'})
    with pytest.raises(ValueError, match="checked_dirs names 'tool'"):
        check_selections(COMMANDS, checked_dirs=('tools', 'tool'))


def test_named_files_exist():
    missing = [f'{command}: {path}' for command in COMMANDS
               for path in named_files(command)
               if not osp.exists(osp.join(REPO, path))]
    assert not missing, 'commands name missing files:\n' + \
        '\n'.join(missing)


def test_make_targets_exist():
    targets = make_targets()
    assert {'install', 'demo', 'test'} <= targets, targets
    unknown = [f'{command}: make {word}' for command in COMMANDS
               if command.argv[0] == 'make' for word in command.argv[1:]
               if not word.startswith('-') and '=' not in word
               and word not in targets]
    assert not unknown, 'commands use targets the Makefile lacks:\n' + \
        '\n'.join(unknown)


@pytest.mark.openmmlab  # the tools' --help imports mmengine, mmdet or mmseg
def test_flags_are_accepted_by_the_tools():
    wrong = []
    for command in COMMANDS:
        shown = flags(command)
        if not shown or not repo_tool(command):
            continue
        tool = python_tool(command)
        if tool is None:
            wrong.append(f'{command}: {repo_tool(command)} takes no options, '
                         f'the page shows {shown}')
            continue
        words = command.argv[2:3] if command.argv[1] == tool else []
        subcommand = words[0] if words and not tool.endswith('.sh') and \
            words[0] in subcommands(tool) else None
        accepted = tool_options(tool, subcommand)
        wrong += [f'{command}: {flag} is not an option of {tool}'
                  for flag in shown if flag not in accepted]
    assert not wrong, '\n'.join(wrong)


def test_launchers_forward_to_a_tool():
    for name, tool in [('dist_train', 'train'), ('dist_test', 'test'),
                       ('slurm_train', 'train'), ('slurm_test', 'test')]:
        assert forwarded_tool(f'tools/{name}.sh') == f'tools/{tool}.py', name
    assert forwarded_tool('tools/demo.sh') is None


def test_python_commands_follow_activation():
    """``python tools/...`` needs the installed stack: each page enters an
    environment before its first such command."""
    wrong = []
    for path in PAGES:
        entered = False
        for command in parse_readme(path):
            if is_activation(command):
                entered = True
            elif command.argv[0] in PYTHONS and repo_tool(command) and \
                    not entered:
                wrong.append(f'{command}: comes before the page says to enter '
                             f'the environment ({" ".join(ACTIVATE)})')
    assert not wrong, '\n'.join(wrong)


def test_heading_anchors():
    assert heading_anchor('What `make demo` does and reaches') == \
        'what-make-demo-does-and-reaches'
    assert heading_anchor('GPU recipe (torch 2.1.2, CUDA 12.1)') == \
        'gpu-recipe-torch-212-cuda-121'
    assert heading_anchor('Which backbone? Accuracy against cost') == \
        'which-backbone-accuracy-against-cost'


def test_docs_pages_are_read():
    pages = {osp.relpath(p, REPO) for p in PAGES}
    assert 'README.md' in pages and len(pages) > 1, pages


def test_relative_links_exist():
    """Every relative link and image of the README, the docs pages, the
    configs' READMEs and the changelog points to a file (and heading) of the
    repository."""
    broken = []
    for page in DOC_PAGES:
        for target in links(page):
            if is_external(target):
                continue
            why = broken_link(page, target)
            if why:
                broken.append(f'{osp.relpath(page, REPO)}: ({target}) {why}')
    assert not broken, 'broken links:\n' + '\n'.join(broken)


#: The repository's top-level folders and files, which a path in a page's
#: inline code starts with.
TOP_LEVEL = ('.ci', 'configs', 'docs', 'mmsoft', 'requirements', 'tests', 'tools',
             'CHANGELOG.md', 'LICENSE', 'Makefile', 'README.md', 'model-index.yml',
             'setup.cfg', 'setup.py')


def repository_paths(path: str) -> List[str]:
    """The paths a page names in inline code (outside code blocks) that
    start with a top-level entry of the repository, or with ``../`` or
    ``/``; another project's paths (``mmdet's `configs/pvt/```) and, under a
    top-level entry, placeholders (``<name>``, ``*``, ``...``, an upper-case
    part such as ``DATE_WHAT.yml``) excepted."""
    with open(path, encoding='utf-8') as f:
        text = _without_code_blocks(f.read())
    out = []
    for match in re.finditer(r'`([^`\s]+)`', text):
        span = match.group(1).split('::')[0].split('#')[0]
        if re.search(r"'s (?:own )?$", text[max(0, match.start() - 12):match.start()]):
            continue
        if not (span.split('/')[0] in TOP_LEVEL or span.startswith(('../', '/'))):
            continue
        if not span.startswith(('../', '/')) and (
                re.search(r'[<>*]|\.\.\.', span) or any(
                    re.fullmatch(r'[A-Z][A-Z0-9_]*', part.split('.')[0])
                    for part in span.split('/'))):
            continue
        out.append(span)
    return out


def test_repository_paths_exist():
    """Every repository path the README, the docs pages, the configs'
    READMEs and the changelog name in inline code exists, inside the
    repository."""
    missing = []
    for page in DOC_PAGES:
        for span in repository_paths(page):
            base = osp.dirname(page) if span.startswith('../') else REPO
            resolved = osp.normpath(osp.join(base, span.lstrip('/')))
            if span.startswith('/') or not resolved.startswith(REPO + os.sep) or \
                    not osp.exists(resolved):
                missing.append(f'{osp.relpath(page, REPO)}: `{span}`')
    assert not missing, 'paths that are not in the repository:\n' + '\n'.join(missing)
    assert 'mmsoft/models/soft.py' in repository_paths(README)


def test_repository_paths_are_read(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text("`tools/train.py`, `../shared/X_Y.md`, `/work/env`, mmdet's "
                    "`configs/pvt/`, timm's own `tests/test_models.py`, "
                    "`docs/records/DATE_WHAT.yml`, `configs/<name>.py`, `work_dirs/x`\n"
                    "```bash\n`tools/none.py`\n```\n")
    assert repository_paths(str(page)) == ['tools/train.py', '../shared/X_Y.md',
                                           '/work/env']


def test_every_lock_file_is_described():
    """The "Lock files" section of Get started names each file of
    ``requirements/locks/``."""
    with open(osp.join(REPO, 'docs', 'get_started.md'), encoding='utf-8') as f:
        section = f.read().split('### Lock files', 1)[1].split('\n#', 1)[0]
    locks = sorted(osp.basename(p) for p in
                   glob.glob(osp.join(REPO, 'requirements', 'locks', '*.txt')))
    assert len(locks) >= 6, locks
    assert [name for name in locks if f'`{name}`' not in section] == []


# ---------------------------------------------------------------- recipes ---
#: The kinds of marked ```` ```python ```` blocks: recipes (a training step
#: and a prediction, on any page) and the README's snippets.
MARKED_KINDS = ('recipe', 'snippet')
#: A recipe's line naming its model.
RECIPE_NAME_LINE = re.compile(r"^NAME = '(\w+)'$", re.M)
#: The timm names each recipe runs with, and the class each builds.
RECIPE_MODELS = {'soft_plus_plus_tiny': ('SOFT', dict(variant='soft++',
                                                      embed_dims=[64, 128, 320, 512])),
                 'ufo_vit_tiny': ('UFOViT', dict(embed_dims=192))}


class Recipe(NamedTuple):
    """A marked ```` ```python ```` block of a page."""
    name: str  #: the marker's name
    page: str  #: the page, relative to the repository
    line: int  #: the page's line number of the first line of code
    code: str
    kind: str = 'recipe'  #: one of :data:`MARKED_KINDS`

    def __str__(self) -> str:
        return f'{self.page}:{self.line} ({self.kind} {self.name})'


class RecipeCheck(NamedTuple):
    """What a recipe needs installed, and what its result must be."""
    needs: Tuple[str, ...]  #: modules whose absence skips it
    check: Callable[[dict], None]  #: asserts on the recipe's variables


def parse_recipes(pages: List[str] = PAGES, kind: str = 'recipe'
                  ) -> Tuple[Dict[str, Recipe], List[str]]:
    """The blocks of ``pages`` marked ``<!-- KIND: NAME -->`` by name, and
    what is wrong with the markers: a marker not right before a
    ```` ```python ```` block, a block without its closing fence, a malformed
    marker, a name used twice."""
    marker = re.compile(rf'<!-- {kind}: ([a-z0-9][a-z0-9-]*) -->')
    recipes, problems = {}, []
    for path in pages:
        page = osp.relpath(path, REPO)
        with open(path, encoding='utf-8') as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if not line.strip().startswith(f'<!-- {kind}'):
                continue
            match = marker.fullmatch(line.strip())
            if not match:
                problems.append(f'{page}:{i + 1}: {line.strip()!r} is not a '
                                f'{kind} marker, <!-- {kind}: NAME -->')
                continue
            name = match.group(1)
            if i + 1 == len(lines) or lines[i + 1].strip() != '```python':
                problems.append(f'{page}:{i + 1}: the marker of {name!r} is not '
                                f'right before a ```python block')
                continue
            end = next((j for j in range(i + 2, len(lines))
                        if lines[j].strip() == '```'), None)
            if end is None:
                problems.append(f'{page}:{i + 2}: the block of {name!r} is not '
                                f'closed')
                continue
            if name in recipes:
                problems.append(f'{page}:{i + 1}: {kind} {name!r} is also at '
                                f'{recipes[name]}')
            recipes[name] = Recipe(name, page, i + 3, '\n'.join(lines[i + 2:end]),
                                   kind)
    return recipes, problems


def recipe_with_model(recipe: Recipe, model_name: str) -> str:
    """The recipe's code with its ``NAME = '...'`` line naming ``model_name``."""
    return RECIPE_NAME_LINE.sub(f'NAME = {model_name!r}', recipe.code)


def run_recipe(recipe: Recipe, code: str) -> Tuple[dict, list]:
    """Runs ``code`` (a recipe's, line numbers kept in tracebacks).

    Returns:
        Its variables, and one dict per optimizer step it took: each
        parameter's value and whether its gradient was nonzero, by ``id``,
        taken just before the step.
    """
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    steps = []

    def before_step(optimizer, args, kwargs):
        steps.append({
            id(param): (param.detach().clone(),
                        param.grad is not None and bool(param.grad.ne(0).any()))
            for group in optimizer.param_groups for param in group['params']})

    namespace = {'__name__': f'recipe_{recipe.name.replace("-", "_")}'}
    source = '\n' * (recipe.line - 1) + code
    handle = register_optimizer_step_pre_hook(before_step)
    try:
        torch.manual_seed(0)
        exec(compile(source, osp.join(REPO, recipe.page), 'exec'), namespace)
    finally:
        handle.remove()
    return namespace, steps


def _check_segmentation(classes: Callable[[dict], int]) -> Callable[[dict], None]:
    """Checks ``predictions``: one class index per pixel of ``masks``."""
    def check(variables: dict) -> None:
        import torch
        predictions, masks = variables['predictions'], variables['masks']
        assert isinstance(predictions, torch.Tensor)
        assert predictions.dtype == torch.int64, predictions.dtype
        assert predictions.shape == masks.shape, (predictions.shape, masks.shape)
        assert 0 <= int(predictions.min()) and \
            int(predictions.max()) < classes(variables)
    return check


def _check_detr(variables: dict) -> None:
    """``predictions``: per image, every query's score, class and box."""
    import torch
    config, images = variables['model'].config, variables['images']
    predictions = variables['predictions']
    assert isinstance(predictions, list) and len(predictions) == len(images)
    for prediction in predictions:
        queries = config.num_queries
        assert prediction['scores'].shape == (queries, )
        assert prediction['labels'].shape == (queries, )
        assert prediction['boxes'].shape == (queries, 4)
        assert ((prediction['scores'] > 0) & (prediction['scores'] <= 1)).all()
        assert ((prediction['labels'] >= 0) &
                (prediction['labels'] < config.num_labels)).all()
        assert torch.isfinite(prediction['boxes']).all()


def _check_torchvision(classes: Callable[[dict], int], with_masks: bool
                       ) -> Callable[[dict], None]:
    """Checks ``predictions``: per image, detections inside it, best first."""
    def check(variables: dict) -> None:
        images, predictions = variables['images'], variables['predictions']
        assert isinstance(predictions, list) and len(predictions) == len(images)
        for image, prediction in zip(images, predictions):
            height, width = image.shape[-2:]
            boxes, scores = prediction['boxes'], prediction['scores']
            count = len(boxes)
            assert count > 0, 'no detection'
            assert boxes.shape == (count, 4) and scores.shape == (count, )
            assert prediction['labels'].shape == (count, )
            assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
            assert (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()
            assert (boxes[:, :2] <= boxes[:, 2:]).all()
            assert ((scores >= 0) & (scores <= 1)).all()
            assert (scores[:-1] >= scores[1:]).all()
            labels = prediction['labels']
            assert ((labels >= 0) & (labels < classes(variables))).all()
            if with_masks:
                masks = prediction['masks']
                assert masks.shape == (count, 1, height, width), masks.shape
                assert ((masks >= 0) & (masks <= 1)).all()
    return check


#: Every recipe of the pages: what it needs and what it must produce.
RECIPES = {
    'transformers-backbone': RecipeCheck(
        ('timm', 'transformers'),
        _check_segmentation(lambda v: v['heads'][0].out_channels)),
    'transformers-detr': RecipeCheck(('timm', 'transformers', 'scipy'), _check_detr),
    'transformers-upernet': RecipeCheck(
        ('timm', 'transformers'),
        _check_segmentation(lambda v: v['model'].config.num_labels)),
    'smp-upernet': RecipeCheck(
        ('timm', 'segmentation_models_pytorch'),
        _check_segmentation(lambda v: v['model'].segmentation_head[0].out_channels)),
    'torchvision-mask-rcnn': RecipeCheck(
        ('torchvision', ),
        _check_torchvision(
            lambda v: v['model'].roi_heads.box_predictor.cls_score.out_features,
            with_masks=True)),
    'torchvision-retinanet': RecipeCheck(
        ('torchvision', ),
        _check_torchvision(lambda v: v['model'].head.classification_head.num_classes,
                           with_masks=False)),
}


def test_recipes_are_on_the_pages():
    """Every recipe of :data:`RECIPES` is marked on a page, and nothing else;
    each names its model once, trains a step and predicts."""
    recipes, problems = parse_recipes()
    assert not problems, '\n'.join(problems)
    assert set(recipes) == set(RECIPES), (
        f'marked on the pages: {sorted(recipes)}; expected: {sorted(RECIPES)}')
    for recipe in recipes.values():
        names = RECIPE_NAME_LINE.findall(recipe.code)
        assert names and names[0] in RECIPE_MODELS and len(names) == 1, \
            f"{recipe}: expected one line NAME = '<one of {list(RECIPE_MODELS)}>'"
        for shown in ('loss.backward()', 'optimizer.step()', 'predictions = ',
                      '.eval()'):
            assert shown in recipe.code, f'{recipe}: does not show {shown!r}'


def test_recipe_parser(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('text\n<!-- recipe: one -->\n```python\nNAME = \'a\'\nx = 1\n```\n'
                    '<!-- recipe: two -->\n\n```python\n```\n'
                    '<!-- recipe:bad -->\n'
                    '<!-- recipe: one -->\n```python\ny = 2\n')
    recipes, problems = parse_recipes([str(page)])
    assert list(recipes) == ['one']
    assert recipes['one'].line == 4 and recipes['one'].code == "NAME = 'a'\nx = 1"
    assert recipe_with_model(recipes['one'], 'b') == "NAME = 'b'\nx = 1"
    assert len(problems) == 3, problems
    assert "'two' is not right before" in problems[0]
    assert 'is not a recipe marker' in problems[1]
    assert 'is not closed' in problems[2]
    page.write_text('<!-- recipe: one -->\n```python\n```\n'
                    '<!-- recipe: one -->\n```python\n```\n')
    recipes, problems = parse_recipes([str(page)])
    assert len(problems) == 1 and "recipe 'one' is also at" in problems[0]
    page.write_text('<!-- snippet: one -->\n```python\nx = 1\n```\n'
                    '<!-- recipe: two -->\n```python\n```\n')
    snippets, problems = parse_recipes([str(page)], 'snippet')
    assert list(snippets) == ['one'] and not problems
    assert str(snippets['one']) == f'{snippets["one"].page}:3 (snippet one)'


@pytest.mark.frameworks
@pytest.mark.parametrize('model_name', list(RECIPE_MODELS))
@pytest.mark.parametrize('name', list(RECIPES))
def test_recipe_runs(name, model_name):
    """The recipe, run with ``model_name``: its backbone is that model, one
    optimizer step moved every backbone parameter that a gradient reached
    (the first convolution's and nine in ten at least), the loss is finite and
    the predictions have the recipe's structure."""
    import torch
    for module in RECIPES[name].needs:
        pytest.importorskip(module)
    recipes, _ = parse_recipes()
    assert name in recipes, f'recipe {name!r} is marked on no page'
    recipe = recipes[name]
    variables, steps = run_recipe(recipe, recipe_with_model(recipe, model_name))

    loss = variables['loss']
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0
    assert torch.isfinite(loss) and loss.item() > 0, loss
    from mmsoft.models.common import DenseBackbone
    backbones = {id(module): module for value in variables.values()
                 if isinstance(value, torch.nn.Module) for module in value.modules()
                 if isinstance(module, DenseBackbone)}
    assert len(backbones) == 1, f'{recipe}: mmsoft models {list(backbones.values())}'
    backbone = next(iter(backbones.values()))
    class_name, attributes = RECIPE_MODELS[model_name]
    assert type(backbone).__name__ == class_name
    assert {key: getattr(backbone, key) for key in attributes} == attributes
    assert len(steps) == 1, f'{recipe}: {len(steps)} optimizer steps, expected one'
    trainable = [(key, param) for key, param in backbone.named_parameters()
                 if param.requires_grad]
    assert trainable
    stepped = steps[0]
    not_optimized = [key for key, param in trainable if id(param) not in stepped]
    assert not not_optimized, f'not in the optimizer: {not_optimized}'
    # Stochastic depth may drop a residual branch for the whole batch: a
    # few parameters without a gradient are expected, the stem's never.
    with_gradient = [(key, param) for key, param in trainable
                     if stepped[id(param)][1]]
    stem = next(m for m in backbone.modules() if isinstance(m, torch.nn.Conv2d))
    assert stepped[id(stem.weight)][1], 'no gradient reached the first convolution'
    assert len(with_gradient) >= 0.9 * len(trainable), (
        f'no gradient reached '
        f'{[key for key, param in trainable if not stepped[id(param)][1]]}')
    unchanged = [key for key, param in with_gradient
                 if torch.equal(stepped[id(param)][0], param.detach())]
    assert not unchanged, f'not changed by the step: {unchanged}'
    RECIPES[name].check(variables)


# --------------------------------------------------------- README snippets ---
def _check_timm_features(variables: dict) -> None:
    """``maps``: SOFT++-tiny's four maps of a 224x224 image, strides 4 to 32."""
    from mmsoft.models import SOFT
    assert any(isinstance(m, SOFT) and m.variant == 'soft++'
               for m in variables['model'].modules())
    assert [tuple(m.shape) for m in variables['maps']] == [
        (1, 64, 56, 56), (1, 128, 28, 28), (1, 320, 14, 14), (1, 512, 7, 7)]


def _write_official_checkpoint(folder: str) -> None:
    """A stand-in for the official ``SOFT_Tiny_norm.pth``: random weights in
    its layout, with its 1000-class head."""
    import torch

    from tests.helpers import official_soft_reference as ref
    torch.save(ref.random_official_state_dict(seed=1, num_classes=1000),
               osp.join(folder, 'SOFT_Tiny_norm.pth'))


def _check_official_checkpoint(variables: dict) -> None:
    """``official`` holds the file's weights: its classifier and stem."""
    import torch
    state = torch.load('SOFT_Tiny_norm.pth', weights_only=True)
    model = variables['official']
    torch.testing.assert_close(model.head.weight, state['head.weight'], rtol=0, atol=0)
    stem = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert any(torch.equal(stem.weight, value) for value in state.values()
               if value.shape == stem.weight.shape)


def _check_detr_model(variables: dict) -> None:
    """``detr``: a DETR on SOFT++-tiny's stride-32 map that predicts."""
    import torch

    from mmsoft.models import SOFT
    detr = variables['detr'].eval()
    assert sum(isinstance(m, SOFT) for m in detr.modules()) == 1
    with torch.no_grad():
        outputs = detr(pixel_values=torch.randn(1, 3, 64, 96))
    config = detr.config
    assert outputs.logits.shape == (1, config.num_queries, config.num_labels + 1)
    assert torch.isfinite(outputs.pred_boxes).all()


def _check_onnx_export(variables: dict) -> None:
    """The file exists, and onnxruntime computed the eager model's four maps at
    both sizes."""
    assert osp.isfile('soft_plus_plus_tiny.onnx')
    results = variables['results']
    assert [result['shape'] for result in results] == [(224, 224), (256, 320)]
    for result in results:
        assert len(result['maps']) == 4 and result['relative'] < 1e-4, result


class SnippetCheck(NamedTuple):
    """How a README snippet runs, and what it must leave."""
    needs: Tuple[str, ...]  #: modules whose absence skips it
    check: Callable[[dict], None]  #: asserts on its variables
    after: Optional[str] = None  #: the snippet it continues
    downloads: Callable[[str], None] = None  #: writes what it reads into a folder


#: The pages whose marked snippets run (``<!-- snippet: NAME -->``): every
#: Python block of the README is one, or a recipe.
SNIPPET_PAGES = [README, osp.join(REPO, 'docs', 'deployment.md')]
#: The snippets that run as Python, and what each leaves.
SNIPPETS = {
    'timm-features': SnippetCheck(('timm', ), _check_timm_features),
    'timm-official-checkpoint': SnippetCheck(
        ('timm', ), _check_official_checkpoint, after='timm-features',
        downloads=_write_official_checkpoint),
    'transformers-detr': SnippetCheck(('timm', 'transformers'), _check_detr_model),
    'onnx-timm': SnippetCheck(('timm', 'onnx', 'onnxruntime'), _check_onnx_export),
}
#: The README's config snippet, and the shipped config it must equal but for
#: the pretrained checkpoint.
CONFIG_SNIPPET = ('openmmlab-config',
                  'configs/soft/mask-rcnn_soft++-tiny_fpn_1x_coco.py')
#: The files a README snippet reads that the reader downloads first, each
#: named in the paragraph before its block.
DOWNLOADS = {'timm-official-checkpoint': 'SOFT_Tiny_norm.pth'}


def readme_snippets() -> Dict[str, Recipe]:
    """The marked snippets of :data:`SNIPPET_PAGES` by name (a malformed
    marker fails)."""
    snippets, problems = parse_recipes(SNIPPET_PAGES, 'snippet')
    assert not problems, '\n'.join(problems)
    return snippets


def test_every_readme_python_block_runs_in_a_test():
    """Each ```` ```python ```` block of the README is a snippet that a test
    runs (:data:`SNIPPETS`, :data:`CONFIG_SNIPPET`) or a recipe; a snippet
    that reads a download says which, in the paragraph before it."""
    with open(README, encoding='utf-8') as f:
        lines = f.read().splitlines()
    blocks = [i for i, line in enumerate(lines) if line.strip() == '```python']
    assert blocks, 'the README has no Python block'
    unmarked = [i + 1 for i in blocks
                if not re.fullmatch(r'<!-- (recipe|snippet): [a-z0-9-]+ -->',
                                    lines[i - 1].strip())]
    assert not unmarked, f'README.md lines {unmarked}: Python blocks no test runs'
    snippets = readme_snippets()
    assert set(snippets) == set(SNIPPETS) | {CONFIG_SNIPPET[0]}, sorted(snippets)
    for name, download in DOWNLOADS.items():
        start = snippets[name].line - 2
        before = '\n'.join(lines[max(0, start - 12):start])
        assert download in before, f'{snippets[name]}: the text before it ' \
            f'does not say to download {download}'


@pytest.mark.frameworks
@pytest.mark.parametrize('name', list(SNIPPETS))
def test_readme_snippet_runs(name, tmp_path, monkeypatch):
    """The snippet, after those it continues, in a fresh folder holding what
    it downloads: it runs and leaves what :data:`SNIPPETS` expects."""
    for module in SNIPPETS[name].needs:
        pytest.importorskip(module)
    snippets = readme_snippets()
    chain = [name]
    while SNIPPETS[chain[0]].after:
        chain.insert(0, SNIPPETS[chain[0]].after)
    monkeypatch.chdir(tmp_path)
    if SNIPPETS[name].downloads:
        SNIPPETS[name].downloads(str(tmp_path))
    namespace = {'__name__': f'readme_{name.replace("-", "_")}'}
    for step in chain:
        snippet = snippets[step]
        source = '\n' * (snippet.line - 1) + snippet.code
        exec(compile(source, osp.join(REPO, snippet.page), 'exec'), namespace)
    SNIPPETS[name].check(namespace)


@pytest.mark.openmmlab
def test_readme_config_is_the_shipped_config():
    """The README's config builds what the shipped SOFT++-tiny Mask R-CNN
    config builds (the valid-region preprocessor, AdamW and its parameter
    groups, mmdet's 1x schedule), but for the pretrained checkpoint."""
    pytest.importorskip('mmdet')
    from mmengine.config import Config
    name, shipped_path = CONFIG_SNIPPET
    readme = Config.fromstring(readme_snippets()[name].code, '.py')
    shipped = Config.fromfile(osp.join(REPO, shipped_path))
    for key in ('init_cfg', 'convert_weights'):
        shipped.model.backbone.pop(key)
    # What the README leaves out, the shipped config sets to the defaults.
    import mmsoft.models
    import mmsoft.openmmlab
    defaults = {}
    for cls in mmsoft.openmmlab.SOFT.__mro__ + mmsoft.models.SOFT.__mro__:
        for key, parameter in inspect.signature(cls.__init__).parameters.items():
            if parameter.default is not inspect.Parameter.empty:
                defaults.setdefault(key, parameter.default)
    for key in set(shipped.model.backbone) - set(readme.model.backbone):
        value = shipped.model.backbone[key]
        assert value == defaults[key] or tuple(value) == tuple(defaults[key]), key
        readme.model.backbone[key] = shipped.model.backbone[key]
    assert readme.model.to_dict() == shipped.model.to_dict()
    for key in ('optim_wrapper', 'param_scheduler', 'train_cfg', 'custom_imports',
                'train_dataloader', 'default_scope'):
        assert readme.get(key) == shipped.get(key), key
    assert readme.model.data_preprocessor.type == 'ValidRegionDetDataPreprocessor'
    assert readme.optim_wrapper.optimizer.type == 'AdamW'


# ----------------------------------------------- the launchers' interpreter ---
def _snippet_python(tools_dir: str, env: Dict[str, str]) -> str:
    """``$PYTHON`` after sourcing ``<tools_dir>/_python.sh``."""
    result = subprocess.run(
        ['bash', '-c', f'. {shlex.quote(tools_dir)}/_python.sh; '
                       'printf %s "$PYTHON"'],
        capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_python_snippet_choice(tmp_path):
    """``tools/_python.sh``: ``$PYTHON``, else the checkout's ``.venv``, else
    ``python``; a symbolic link to ``tools/`` leads to the checkout."""
    checkout = tmp_path / 'checkout'
    (checkout / 'tools').mkdir(parents=True)
    with open(osp.join(REPO, 'tools', '_python.sh')) as f:
        (checkout / 'tools' / '_python.sh').write_text(f.read())
    env = {k: v for k, v in os.environ.items() if k != 'PYTHON'}
    tools = str(checkout / 'tools')
    assert _snippet_python(tools, env) == 'python'
    venv_python = checkout / '.venv' / 'bin' / 'python'
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text('#!/bin/sh\n')
    venv_python.chmod(0o755)
    assert _snippet_python(tools, env) == str(venv_python)
    linked = tmp_path / 'elsewhere'
    linked.mkdir()
    (linked / 'tools').symlink_to(checkout / 'tools')
    assert _snippet_python(str(linked / 'tools'), env) == str(venv_python)
    assert _snippet_python(tools, {**env, 'PYTHON': '/opt/py'}) == '/opt/py'


def test_launchers_use_the_snippet():
    for name in ('dist_train', 'dist_test', 'slurm_train', 'slurm_test', 'demo'):
        with open(osp.join(REPO, 'tools', f'{name}.sh')) as f:
            text = f.read()
        assert re.search(r'^\. "?(\$TOOLS_DIR|tools)/_python\.sh"?$', text,
                         re.M), f'tools/{name}.sh does not source _python.sh'
        assert '${PYTHON:-' not in text, f'tools/{name}.sh picks its own python'


# ----------------------------------------------------- running the section ---
def _in_checkout_venv() -> bool:
    """Whether the tests run in the checkout's ``.venv``."""
    return osp.isdir(VENV) and \
        osp.realpath(sys.prefix) == osp.realpath(VENV)


def _free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _executable(path: str, text: str) -> None:
    """Writes an executable script."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP |
             stat.S_IXOTH)


def _path_without_environments() -> List[str]:
    """``PATH`` without the checkout's ``.venv`` and the active environment."""
    drop = {osp.realpath(osp.join(VENV, 'bin'))}
    if os.environ.get('VIRTUAL_ENV'):
        drop.add(osp.realpath(osp.join(os.environ['VIRTUAL_ENV'], 'bin')))
    if sys.prefix != sys.base_prefix:
        drop.add(osp.realpath(osp.dirname(sys.executable)))
    return [p for p in os.environ.get('PATH', '').split(os.pathsep)
            if p and osp.realpath(p) not in drop]


def _world_size(command: Command) -> int:
    """Processes of a ``tools/dist_*.sh`` command (its last positional
    argument, NPROC), else 1."""
    tool = repo_tool(command) or ''
    if osp.basename(tool).startswith('dist_'):
        return int([w for w in command.argv if not w.startswith('-')][-1])
    return 1


def _tiny_arguments(command: Command, data_root: str, helpers) -> List[str]:
    """Options appended to a command of the run section to make it quick."""
    tool = osp.basename(python_tool(command) or '')
    if tool == 'generate_demo_data.py':
        return ['--num-train', '4', '--num-val', '2', '--img-size', '96']
    if tool == 'train.py':
        # Batch 2 per process, one iteration per epoch; the checkpoint and
        # the validation of the last epoch only.
        images = 2 * _world_size(command)
        return ['--cfg-options',
                *helpers.tiny_options(data_root, train_images=images),
                'train_cfg.val_interval=1000',
                'default_hooks.checkpoint.interval=1000']
    if tool == 'test.py':
        return ['--cfg-options', *helpers.tiny_options(data_root)]
    raise AssertionError(f'{command}: no quick version of this command is '
                         'known; add one to _tiny_arguments in '
                         'tests/test_readme.py')


@pytest.fixture(scope='module')
def section_runs(tmp_path_factory) -> List[dict]:
    """Runs the runnable commands of the run section in order; stops at the
    first failure. Returns one record per command run."""
    check_selections(COMMANDS)
    helpers = _load_tool_helpers()
    scratch = tmp_path_factory.mktemp('readme_run')
    for name in ('tools', 'configs'):
        os.symlink(osp.join(REPO, name), scratch / name)
    data_root = str(scratch / 'data' / 'demo_coco')  # the generator's default
    # `python` of an activated environment: the interpreter of the tests.
    env_bin = str(scratch / 'env_bin')
    _executable(osp.join(env_bin, 'python'),
                f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    # `python` elsewhere on PATH: must not be what a launcher runs.
    other_bin = str(scratch / 'other_bin')
    _executable(osp.join(other_bin, 'python'),
                '#!/bin/sh\necho "python from PATH was run, not the '
                'checkout\'s .venv/bin/python" >&2\nexit 97\n')
    base = {k: v for k, v in _base_env().items()
            if k not in ('PYTHON', 'VIRTUAL_ENV')}
    path = _path_without_environments()
    fallback = _in_checkout_venv()

    records = []
    for command in COMMANDS:
        if command.section != RUN_SECTION or is_synopsis(command):
            continue
        if tuple(command.argv[:2]) == ACTIVATE:
            continue  # entered: `python` below is the tests' interpreter
        if repo_tool(command) in NOT_RUN:
            continue
        env = dict(base, PORT=str(_free_port()))
        launcher = command.argv[0] in SHELLS
        if launcher:
            env['PATH'] = os.pathsep.join([other_bin, *path])
            if not fallback:
                env['PYTHON'] = sys.executable
        else:
            env['PATH'] = os.pathsep.join([env_bin, *path])
        argv = command.argv + _tiny_arguments(command, data_root, helpers)
        result = subprocess.run(argv, cwd=scratch, env=env, capture_output=True,
                                text=True, timeout=RUN_TIMEOUT)
        records.append(dict(command=command, argv=argv, launcher=launcher,
                            python_set='PYTHON' in env,
                            output=result.stdout + result.stderr,
                            returncode=result.returncode))
        if result.returncode != 0:
            break
    return records


@pytest.mark.mmcv_ops  # section_runs trains Mask R-CNN
def test_run_section_commands_work(section_runs):
    assert section_runs, f'no runnable command in "{RUN_SECTION}"'
    for record in section_runs:
        assert record['returncode'] == 0, (
            f'{record["command"]}\nrun as: {shlex.join(record["argv"])}\n'
            f'exit status {record["returncode"]}\n{record["output"][-6000:]}')
    ran = {repo_tool(r['command']) for r in section_runs}
    assert {'tools/generate_demo_data.py', 'tools/dist_train.sh',
            'tools/dist_test.sh'} <= ran, ran
    for record in section_runs:
        world = _world_size(record['command'])
        if world > 1:
            assert f'GPU number: {world}' in record['output']  # world size
        if osp.basename(python_tool(record['command'])) == 'test.py':
            assert re.search(r'coco/bbox_mAP:? +[0-9.]+', record['output'])


@pytest.mark.mmcv_ops  # section_runs trains Mask R-CNN
def test_launchers_find_the_checkout_venv(section_runs):
    """The shell launchers of the section ran with ``PYTHON`` unset and a
    ``PATH`` whose ``python`` fails: they used ``.venv/bin/python``."""
    if not osp.isdir(VENV):
        pytest.skip(f'{VENV} does not exist (`make install` creates it), so '
                    'the launchers were given PYTHON')
    if not _in_checkout_venv():
        pytest.skip(f'the tests run in {sys.prefix}, not in {VENV} (as '
                    '`make test` runs them), so the launchers were given PYTHON')
    launched = [r for r in section_runs if r['launcher']]
    assert launched, f'no shell launcher among the commands of "{RUN_SECTION}"'
    for record in launched:
        assert not record['python_set']
        assert record['returncode'] == 0, record['output'][-3000:]


def _layout_table() -> Dict[str, str]:
    """The first table of the "Where things live" section of the page that
    has it (a ``#`` or ``##`` heading): path -> description."""
    for path in PAGES:
        with open(path, encoding='utf-8') as f:
            text = f.read()
        parts = re.split(rf'^#{{1,2}} {LAYOUT_SECTION}\n', text, maxsplit=1,
                         flags=re.M)
        if len(parts) == 2:
            table = re.search(r'^\|.*\|\n(?:\|.*\|\n)*', parts[1], re.M)
            return dict(re.findall(r'^\| `([^`]+)` \| (.+) \|$',
                                   table.group() if table else '', re.M))
    return {}


def test_layout_table_matches_the_tree():
    table = _layout_table()
    assert table, f'no page has a "{LAYOUT_SECTION}" table'
    missing = [path for path in table if not osp.exists(osp.join(REPO, path))]
    assert not missing, f'the layout table names paths that do not exist: ' \
        f'{missing}'
    # Every package of mmsoft below the top level is described.
    packages = set()
    for root, dirs, files in os.walk(osp.join(REPO, 'mmsoft')):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        rel = osp.relpath(root, REPO) + '/'
        if '__init__.py' in files and rel.count('/') >= 2:
            packages.add(rel)
    assert 'mmsoft/models/' in packages, packages
    undescribed = sorted(packages - set(table))
    assert not undescribed, \
        f'packages missing from the layout table: {undescribed}'
