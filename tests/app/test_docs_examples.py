"""The documentation cannot rot: the commands it shows name configs that exist and build, and its links lead to files.

Every ```` ```bash ```` block of README.md and of the site's pages (``docs/**/*.md``) is read as the shell would read it
(lines continued by ``\\``, comments dropped). Every ``configs/….yaml`` a command names must exist, and every
``python -m app fit|validate --config configs/… [flags]`` (or ``lightrl fit|validate …``) must build: its configs
composed in order with its flags, on the CPU, as :func:`app.cli.build` builds a run before training (the parser, the
constructors' checks, the trainer). Nothing is collected or trained, so each command costs its constructors only
(the approach of ``tests/app/test_presets.py``, which builds the ``configs/bench/`` combinations: a command that is only
such a combination is left to it). Every relative Markdown link and image must point to a file that
exists; a page's links stay inside ``docs/`` (MkDocs rejects others: a repository file is named in inline code), and
a link's ``#anchor`` into a page must be one of that page's headings.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from pathlib import Path

import lightning.pytorch as pl
import pytest

from app.cli import build
from datamodules.base import RLDataModule
from modules.base import RLModule
from tests.app.test_presets import combinations as preset_combinations
from tests.helpers import DOCS, ROOT

#: the preset combinations tests/app/test_presets.py builds (the GPU presets, every `configs/bench/` combination)
PRESET_COMBINATIONS = set(preset_combinations())

#: README and the site's pages
DOCUMENTS = sorted([*(path for path in (ROOT / "README.md",) if path.is_file()), *DOCS.glob("**/*.md")])

# Runs on a CPU, one thread, after the command's own flags (the last value of a flag wins).
ON_CPU = ("--threads", "1", "--trainer.accelerator", "cpu", "--trainer.devices", "1")
# A flag that prints the config and exits instead of building it.
NOT_FOR_BUILD = {"--print_config"}

_FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
_CONFIG_PATH = re.compile(r"(?<![\w/.-])configs/[\w/.-]+\.ya?ml\b")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(info string, body)`` of each fenced code block, indented ones (inside list items) included."""
    blocks = []
    for match in _FENCE.finditer(text):
        indent, info, body = match.groups()
        lines = [line[len(indent) :] if line.startswith(indent) else line for line in body.splitlines()]
        blocks.append((info.strip(), "\n".join(lines)))
    return blocks


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a bash block, as the shell splits them: continued lines joined, comments dropped, each
    ``&&``-joined command on its own."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a command these tests can read
            continue
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", ";", "|"):
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(word)
    return commands


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(document, words)`` of every command in every ``bash`` block of the documents."""
    found = []
    for document in DOCUMENTS:
        for info, body in fenced_blocks(document.read_text()):
            if info.split()[:1] == ["bash"]:
                found.extend((relative(document), words) for words in shell_commands(body))
    return found


def app_arguments(words: list[str]) -> tuple[str, list[str]] | None:
    """``(subcommand, arguments)`` of ``python -m app <subcommand> ...`` or ``lightrl <subcommand> ...``, after any
    ``NAME=value`` assignments; None for any other command."""
    while words and _ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    if words[:3] == ["python", "-m", "app"] and len(words) > 3:
        return words[3], words[4:]
    if words[:1] == ["lightrl"] and len(words) > 1:
        return words[1], words[2:]
    return None


def split_configs(arguments: list[str]) -> tuple[list[str], list[str]]:
    """The ``--config`` files in order, and the other flags in order (``--flag value`` and ``--flag=value`` alike)."""
    configs, flags = [], []
    words = iter(arguments)
    for word in words:
        if word == "--config":
            configs.append(next(words, ""))
        elif word.startswith("--config="):
            configs.append(word.split("=", 1)[1])
        else:
            flags.append(word)
    return configs, flags


def buildable_commands() -> dict[tuple[tuple[str, ...], tuple[str, ...]], str]:
    """``{(configs, flags): where}`` of every ``fit``/``validate`` command whose configs are all shipped ones (an
    example's own file, ``corridor_dqn.yaml``, is run by the test of its page), first mention first."""
    found: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
    for document, words in documented_commands():
        parsed = app_arguments(words)
        if parsed is None or parsed[0] not in ("fit", "validate"):
            continue
        configs, flags = split_configs(parsed[1])
        if not configs or not all(_CONFIG_PATH.fullmatch(config) for config in configs):
            continue  # an example's own config, or a placeholder (`configs/gym/<config>.yaml`)
        flags = [flag for flag in flags if flag not in NOT_FOR_BUILD]
        if not flags and tuple(configs) in PRESET_COMBINATIONS:
            continue  # built by tests/app/test_presets.py already
        found.setdefault((tuple(configs), tuple(flags)), f"{document}: {shlex.join(words)}")
    return found


COMMANDS = buildable_commands()


def test_the_documents_show_commands_to_check():
    # A parser that found nothing would make the tests below vacuous: the getting-started page's first run is there.
    assert (("configs/snake_dqn.yaml",), ()) in COMMANDS
    assert any(flags for _, flags in COMMANDS), "no command with flags found"


#: The front page's sections, in order: what a newcomer reads first.
README_SECTIONS = [
    "Why lightrl",
    "Install",
    "First run",
    "How it fits together",
    "Systems and results",
    "Documentation",
    "Tests",
    "License",
]


def test_the_readme_keeps_its_sections_its_commands_and_ci_runs_its_test_command():
    # An edit that loses a section or a command of the front page fails here (once, a replacement of the empty
    # string wrote a paragraph between every character of it, and no other test failed).
    text = (ROOT / "README.md").read_text()
    assert re.findall(r"^## (.+)$", text, re.MULTILINE) == README_SECTIONS
    assert len(text.splitlines()) < 200, "README.md is meant to be short: the documentation site holds the rest"
    commands = [
        shlex.join(words) for info, body in fenced_blocks(text) if info == "bash" for words in shell_commands(body)
    ]
    for command in (
        "pip install torch==2.13.0",
        "lightrl fit --config configs/gym/cartpole_ppo.yaml",
        "lightrl fit --config configs/gym/cartpole_ppo.yaml --ckpt_path last",
        "python -m pytest -q -n logical tests",
        "python -m pytest -q -n logical tests -m 'not slow'",
    ):
        assert command in commands, f"README.md lost the command {command!r}"
    # CI runs the README's test command (with the slowest tests listed at the end of its log).
    tests = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.startswith("python -m pytest")]
    assert len(tests) == 1 and tests[0].startswith("python -m pytest -q -n logical tests"), tests


def test_every_config_a_command_names_exists():
    missing = []
    for document, words in documented_commands():
        for path in _CONFIG_PATH.findall(" ".join(words)):
            if not (ROOT / path).is_file():
                missing.append(f"{document}: `{shlex.join(words)}` names {path}, which does not exist")
    assert not missing, "\n".join(missing)


def skip_without_packages(configs: tuple[str, ...], flags: tuple[str, ...]) -> None:
    """Skip a command whose optional extra is not installed (as the documents say to install it)."""
    text = "".join((ROOT / config).read_text() for config in configs) + " ".join(flags)
    needs = {
        "envs.mettagrid": ("mettagrid", "metta"),
        "envs.mario": ("nes_py", "mario"),
        "envpool_env": ("envpool", "envpool"),
        "LunarLander": ("Box2D", "gym"),
        "HalfCheetah": ("mujoco", "gym"),
        "ALE/": ("ale_py", "gym"),
        "wandb": ("wandb", "wandb"),
        "mlflow": ("mlflow", "mlflow"),
        "tensorboard": ("tensorboard", "tensorboard"),
        "callbacks.video": ("imageio_ffmpeg", "video"),
    }
    for marker, (module, extra) in needs.items():
        if marker in text:
            pytest.importorskip(module, reason=f'the {extra} extra: pip install -e ".[{extra}]"')


@pytest.mark.parametrize(
    ("configs", "flags"),
    list(COMMANDS),
    ids=[" ".join(["+".join(Path(config).stem for config in configs), *flags]) for configs, flags in COMMANDS],
)
def test_documented_command_builds_on_the_cpu(configs, flags, tmp_path, monkeypatch, capsys):
    """The command's configs and flags, built as ``fit`` builds them; a refused option fails with the CLI's own error
    line (the parser exits with status 2 after printing it)."""
    skip_without_packages(configs, flags)
    monkeypatch.chdir(tmp_path)  # relative output folders land here, if anything is written at all
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # configs name other configs from the repository's root
    try:
        model, data = build(list(configs), [*flags, *ON_CPU])
    except SystemExit as exit_:
        where = COMMANDS[(configs, flags)]
        pytest.fail(f"{where}\nis refused (exit {exit_.code}): {capsys.readouterr().err.strip()}")
    # an agent on its data module, or a supervised stage (racing's behaviour cloning on its demonstrations)
    assert isinstance(model, pl.LightningModule) and isinstance(data, pl.LightningDataModule)
    assert isinstance(model, RLModule) == isinstance(data, RLDataModule)


# --- links ---------------------------------------------------------------------------------------------------------

_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
_EXPLICIT_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}|\bid=[\"']([\w-]+)[\"']")


def prose(text: str) -> str:
    """The text outside code: fenced blocks and inline code removed."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    text = prose(text)
    return _LINK.findall(text) + _REFERENCE.findall(text)


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's ``toc``) makes it by default."""
    text = re.sub(r"\{[^}]*\}\s*$", "", heading)  # an attribute list is not part of the title
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    found = {slug(heading) for heading in _HEADING.findall(text)}
    found |= {first or second for first, second in _EXPLICIT_ID.findall(text)}
    return found


def broken_links(document: Path) -> list[str]:
    problems = []
    for target in links(document.read_text()):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # a web address or mailto:
        path_part, _, anchor = target.partition("#")
        path_part = path_part.split("?", 1)[0]
        page = (document.parent / path_part).resolve() if path_part else document
        where = f"{relative(document)}: ({target})"
        if path_part.startswith("/"):
            problems.append(f"{where} is an absolute path")
            continue
        if not page.exists():
            problems.append(f"{where} leads to no file")
            continue
        if document.is_relative_to(DOCS) and not page.is_relative_to(DOCS):
            problems.append(f"{where} leaves docs/: name a repository file in inline code instead")
            continue
        if anchor and page.suffix == ".md" and page.is_file() and anchor not in anchors(page):
            problems.append(f"{where}: {relative(page)} has no heading #{anchor}")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=relative)
def test_every_relative_link_leads_to_a_file(document):
    problems = broken_links(document)
    assert not problems, "\n".join(problems)


def test_the_link_checks_find_links():
    # README links to the docs; a page of the guide links to other pages: a regex that found none would pass anything.
    assert any(links(document.read_text()) for document in DOCUMENTS)
    assert [target for target in links("[a](b.md) ![c](d.png) `[e](f.md)` [g](h.md#i)")] == ["b.md", "d.png", "h.md#i"]
    assert slug("Checkpoints and `--ckpt_path last`") == "checkpoints-and-ckpt_path-last"
    racing = "4. Racing: demonstrations → behaviour cloning → SAC"
    assert slug(racing) == "4-racing-demonstrations-behaviour-cloning-sac"
