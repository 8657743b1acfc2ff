"""The commands and links of README.md and of the docs pages work as written.

The pages are ``README.md`` and every ``docs/**/*.md``. Only their fenced
```` ```bash ```` blocks are read, command by command (a backslash at the
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
  ``#anchor``, if any, a heading of the Markdown page it points to;
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
  ``configs/`` linked into it) with options appended that shrink them to seconds: a few 96x96 images,
  one iteration per epoch. ``python`` is the interpreter running the tests,
  as in an activated environment; the shell launchers run with ``PYTHON``
  unset and without that environment on ``PATH``, where ``python`` is a
  stand-in that fails, so they have to find the checkout's ``.venv`` by
  themselves (when the tests run in another environment, the launchers get
  ``PYTHON`` and that check is skipped). The scripts in :data:`NOT_RUN` are
  left out there, to keep the run short: other tests run them with the same
  config;
- the table of "Where things live" names existing paths and every package
  of ``mmsoft``.
"""
import functools
import glob
import importlib.util
import os
import os.path as osp
import re
import shlex
import socket
import stat
import subprocess
import sys
from typing import Dict, List, NamedTuple, Optional

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
README = osp.join(REPO, 'README.md')
#: The pages whose commands and links are checked: the README and the docs.
PAGES = [README] + sorted(
    glob.glob(osp.join(REPO, 'docs', '**', '*.md'), recursive=True))
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
    """The repository Python tool whose options the command passes."""
    tool = repo_tool(command)
    if tool and tool.endswith('.sh') and osp.isfile(osp.join(REPO, tool)):
        return forwarded_tool(tool)
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
def tool_options(tool: str) -> frozenset:
    """The ``--options`` in ``python <tool> --help``."""
    result = subprocess.run([sys.executable, osp.join(REPO, tool), '--help'],
                            capture_output=True, text=True, timeout=120,
                            env=_base_env(), cwd=REPO)
    assert result.returncode == 0, \
        f'{tool} --help failed:\n{result.stdout}{result.stderr}'
    return frozenset(re.findall(r'(?<![\w-])(--[A-Za-z][\w-]*)', result.stdout))


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
        accepted = tool_options(tool)
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
    """Every relative link and image of the README and the docs pages points
    to a file (and heading) of the repository."""
    broken = []
    for page in PAGES:
        for target in links(page):
            if is_external(target):
                continue
            why = broken_link(page, target)
            if why:
                broken.append(f'{osp.relpath(page, REPO)}: ({target}) {why}')
    assert not broken, 'broken links:\n' + '\n'.join(broken)


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
    """The "Where things live" table of the page that has it (a ``#`` or
    ``##`` heading): path -> description."""
    for path in PAGES:
        with open(path, encoding='utf-8') as f:
            text = f.read()
        parts = re.split(rf'^#{{1,2}} {LAYOUT_SECTION}\n', text, maxsplit=1,
                         flags=re.M)
        if len(parts) == 2:
            section = re.split(r'^#{1,2} ', parts[1], maxsplit=1,
                               flags=re.M)[0]
            return dict(re.findall(r'^\| `([^`]+)` \| (.+) \|$', section,
                                   re.MULTILINE))
    return {}


def test_layout_table_matches_the_tree():
    table = _layout_table()
    assert table, f'no page has a "{LAYOUT_SECTION}" table'
    missing = [path for path in table if not osp.exists(osp.join(REPO, path))]
    assert not missing, f'the layout table names paths that do not exist: ' \
        f'{missing}'
    # Every package of mmsoft below the top level is described, at the depth
    # the table uses (mmsoft/<pkg>/, mmsoft/models/<pkg>/<model>/).
    packages = set()
    for root, dirs, files in os.walk(osp.join(REPO, 'mmsoft')):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        rel = osp.relpath(root, REPO) + '/'
        if '__init__.py' in files and rel.count('/') >= 2 and rel not in (
                'mmsoft/models/', 'mmsoft/models/layers/'):
            packages.add(rel)
    undescribed = sorted(packages - set(table))
    assert not undescribed, \
        f'packages missing from the layout table: {undescribed}'
