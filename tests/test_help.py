"""Help texts and documented commands: one spelling per option, examples that parse.

The README's and every ``--help`` example's ``spdnn`` commands are parsed by
the real parser, so a renamed flag or a typo in the docs fails here.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from conftest import options, subparsers

from spdnn_mpi.cli import COMMAND_MODULES, SUBCOMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[1]


#: same option name, different meaning on purpose
DIFFERENT_ON_PURPOSE = {
    "--out",  # the store to write (generate, prepare) vs the categories file (infer)
    "--layers",  # bench: repeatable list of counts; elsewhere one count
    "--compress",  # bench also has "both" (time off and auto side by side)
}


def test_same_option_same_metavar_and_choices_everywhere():
    seen: dict[str, tuple[str, argparse.Action]] = {}
    clashes = []
    for name, p in subparsers().items():
        for opt, action in options(p).items():
            if opt in ("-h", "--help") or opt in DIFFERENT_ON_PURPOSE:
                continue
            if opt in seen:
                other_name, other = seen[opt]
                if (action.metavar, action.choices) != (other.metavar, other.choices):
                    clashes.append(f"{opt}: {other_name} {other.metavar}/{other.choices} vs "
                                   f"{name} {action.metavar}/{action.choices}")
            else:
                seen[opt] = (name, action)
    assert not clashes, clashes


def test_shared_names_read_the_same():
    subs = subparsers()
    for name in ("generate", "demo", "bench", "prepare"):
        assert options(subs[name])["--images"].metavar == "COUNT", name
    for name in ("info", "import", "infer", "demo", "bench"):
        assert options(subs[name])["--json"].metavar == "FILE", name
    for name in ("generate", "prepare"):
        assert options(subs[name])["--truth-layers"].metavar == "L1,L2,..."
        assert options(subs[name])["--truth-backend"].choices == ["reference", "cpu", "none"]
    assert "--layers-truth" not in options(subs["generate"])  # hidden alias


def test_seed_defaults_to_one_everywhere():
    subs = subparsers()
    for name in ("generate", "demo", "bench"):
        assert options(subs[name])["--seed"].default == 1, name
    args = build_parser().parse_args(["generate", "--neurons", "1024", "--layers", "2",
                                      "--out", "x.h5"])
    assert args.seed == 1


def test_old_spelling_layers_truth_still_works():
    args = build_parser().parse_args(["generate", "--neurons", "1024", "--layers", "9",
                                      "--out", "x.h5", "--layers-truth", "3,9"])
    assert args.truth_layers == [3, 9]
    args = build_parser().parse_args(["generate", "--neurons", "1024", "--layers", "9",
                                      "--out", "x.h5"])
    assert args.truth_layers is None


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_subcommand_help_has_examples(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"spdnn {name}" in text.split("examples:")[1]
    assert "(4096, 120)" not in text and "(default: None)" not in text


def test_bench_help_states_defaults_and_columns(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split()).split("options:", 1)[1]
    assert "(default: 4096x120)" in text
    assert "repeatable: --peer" in text
    for option in ("--threads COUNT", "--batch ROWS", "--data-dir DIR"):
        after = text.split(option, 1)[1][:200]
        assert "default" in after, option
    assert "x<peer> = <peer>_s / our off time" in text


def test_prepare_help_gives_bias_per_n(capsys):
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for n, b in ((1024, "-0.3"), (4096, "-0.35"), (16384, "-0.4"), (65536, "-0.45")):
        assert f"{b} for N={n}" in text


def spdnn_commands(text: str) -> list[str]:
    """``spdnn ...`` command lines (joined over trailing backslashes), outside tables."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.search(r"(?:^|\s)(spdnn (?:generate|prepare|import|info|infer|bench|demo)"
                      r"(?=\s|$).*)", line)
        if m and not line.startswith("|"):
            out.append(m.group(1).strip().rstrip("`"))
    return out


def is_template(command: str) -> bool:
    """A synopsis with placeholders (``--neurons N``, ``[--json F]``), not a command."""
    return bool(re.search(r"[\[|<]|\.\.\.|(?:^|\s)[A-Z][A-Z_]*(?:\s|$)", command))


def _parses(command: str) -> None:
    command = re.split(r"\s[>|]\s", command)[0]  # a shell redirection or pipe
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"does not parse: {command}") from exc


def test_help_examples_parse():
    commands = []
    for name in SUBCOMMANDS:
        module = __import__(f"spdnn_mpi.commands.{COMMAND_MODULES.get(name, name)}",
                            fromlist=["EXAMPLES"])
        commands += spdnn_commands(module.EXAMPLES)
    assert len(commands) >= 2 * len(SUBCOMMANDS) - 1
    for command in commands:
        _parses(command)


def test_readme_and_docs_commands_parse():
    commands = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
        inline = [" ".join(c.split()) for c in re.findall(r"`(spdnn [^`]+)`", text)]
        commands += spdnn_commands("\n".join(blocks))
        commands += [c for c in inline if len(c.split()) > 2]  # not a bare name in prose
    commands = [c for c in commands if not is_template(c)]
    assert any("--generate-inputs" in c for c in commands)  # the recipe that works as shipped
    assert len(commands) >= 10
    for command in commands:
        _parses(command)


def test_readme_recipes_work_with_what_ships():
    """The README's prepare recipe needs only the shipped weights; sbatch has both forms."""
    text = (REPO / "README.md").read_text()
    blocks = "\n".join(re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S))
    prepares = [c for c in spdnn_commands(blocks) if c.startswith("spdnn prepare")]
    shipped = [c for c in prepares if "--generate-inputs" in c and "--truth-layers" in c]
    assert shipped and all("--categories" not in c for c in shipped)
    assert any("--inputs" in c and "--categories" in c for c in prepares)  # official files
    sbatch = [line for line in blocks.splitlines() if line.startswith("sbatch ")]
    assert any("--gpus-per-task=0" in line and "SPDNN_BACKEND=cpu" in line for line in sbatch)
    assert any("--gpus-per-task" not in line for line in sbatch)
    assert "Invalid generic resource (gres) specification" in text
