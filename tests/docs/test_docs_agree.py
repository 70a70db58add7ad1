"""README.md, docs/*.md and RELIABILITY.md agree with the code, so they cannot drift:

* every `tuned ...` command they show (code blocks and inline code) parses with tuned's
  own argument parser exactly as `tuned` would parse it: known subcommand, known
  options, valid choices and types, nothing left over (vLLM's arguments only after
  ``--``, and only for a subcommand that takes them);
* every ``tuned_*`` name they mention is a series tuned's metrics module exports (by
  its sample name: ``_total`` for counters, ``_info`` for info; a histogram by its
  family name too) or a request hint key tuned reads.

(tests/docs/test_docs_own_command.py checks docs/kubernetes.md's vLLM command line.)"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tuned.commands import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "RELIABILITY.md", *sorted((ROOT / "docs").glob("*.md"))]
#: hint keys RELIABILITY.md shows misspelt on purpose (what tuned does with a typo)
MISSPELT_ON_PURPOSE = {"tuned_deadlin_s", "tuned_x"}
SHELL_STOPS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}
SYSTEMD_TOOLS = {"systemctl", "journalctl", "systemd-analyze", "systemd-run"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every code line: fenced blocks, 4-space indented blocks
    (outside lists), and inline code spans; continuation lines joined."""
    out: list[tuple[int, str]] = []
    fenced = False
    pending, start = "", 0
    prev_blank = True
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        in_block = fenced or (line.startswith("    ") and (prev_blank or pending
                                                            or out and out[-1][0] == n - 1))
        prev_blank = not line.strip()
        if in_block:
            text = line.strip()
            if pending:
                text = pending + " " + text
            else:
                start = n
            if text.endswith("\\"):
                pending = text[:-1].rstrip()
                continue
            pending = ""
            out.append((start, text))
        else:
            out += [(n, span) for span in re.findall(r"`([^`\n]+)`", line)]
    return out


def _expand(text: str) -> list[str]:
    """Documentation placeholders: ``[optional ...]`` dropped, ``{a,b}`` one command
    per alternative."""
    text = re.sub(r"\s\[[^\]]*\]", "", text)
    m = re.search(r"\{([\w.,-]+)\}", text)
    if m and "," in m.group(1):
        return [x for alt in m.group(1).split(",")
                for x in _expand(text[:m.start()] + alt + text[m.end():])]
    return [text]


def tuned_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `tuned`) for each documented tuned command."""
    sub_names = set(_subcommands())
    found = []
    for path in DOCS:
        for n, text in code_lines(path):
            if "..." in text or "…" in text:
                continue  # an elided command: not meant to run as written
            for variant in _expand(text):
                try:
                    tokens = shlex.split(variant, comments=True)
                except ValueError:
                    continue
                for i, tok in enumerate(tokens):
                    if tok != "tuned" and not tok.endswith("bin/tuned"):
                        continue  # not the command (/var/lib/tuned, the unit name)
                    if SYSTEMD_TOOLS & set(tokens[:i]):
                        break     # systemctl reload tuned, journalctl -u tuned -f
                    rest = tokens[i + 1:]
                    if not rest or (rest[0] not in sub_names and not rest[0].startswith("-")):
                        continue  # prose or output ("tuned at http://...", "tuned reload:")
                    argv = []
                    for t in rest:
                        if t in SHELL_STOPS:
                            break
                        argv.append(t)
                    found.append((f"{_rel(path)}:{n}: {variant}", argv))
                    break
    return found


def _subcommands() -> dict:
    parser = cli.build_parser()
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"
                ).choices


def parse_as_tuned(argv: list[str]) -> str:
    """'' when `tuned` parses ``argv`` (as :func:`tuned.commands.cli.main` does, without running
    it), else the one line it prints."""
    err = io.StringIO()
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    parser = cli.build_parser()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args, extras = parser.parse_known_args(argv)
            if extras:
                return f"left over: {extras}"
            if not getattr(args, "func", None):
                return "no subcommand"
            if passthrough and not hasattr(args, "vllm_args"):
                return f"{args.command} takes no arguments after --"
        except SystemExit as e:
            if e.code in (0, None):
                return ""   # --help, --version
            return err.getvalue().strip() or f"exit {e.code}"
    return ""


def test_the_docs_show_tuned_commands():
    cmds = tuned_commands()
    subs = {argv[0] for _, argv in cmds if argv}
    # every subcommand an operator reaches from the docs; the test is not vacuous
    assert {"serve", "check-config", "status", "reload", "profile", "bench", "simulate",
            "demo"} <= subs, subs
    assert len(cmds) >= 40, len(cmds)


@pytest.mark.parametrize("where, argv", tuned_commands(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_documented_command_parses(where, argv):
    subs = _subcommands()
    if len(argv) <= 2 and argv[0] in subs:
        # a mention (`tuned simulate`, `tuned profile --model`), not a command line: the
        # subcommand and the option exist
        options = {o for a in subs[argv[0]]._actions for o in a.option_strings}
        assert [a for a in argv[1:] if a.startswith("-") and a not in options] == [], where
        return
    problem = parse_as_tuned(argv)
    # a placeholder (NAME, DIR, FILE) where a choice is due is the documented form
    placeholders = [a for a in argv if re.fullmatch(r"[A-Z][A-Z_]*", a)]
    if any(f"invalid choice: '{p}'" in problem for p in placeholders):
        problem = ""
    assert problem == "", where


def test_the_check_catches_a_wrong_command():
    assert parse_as_tuned(["serve", "--config", "c.toml", "meta-llama/x"]) == \
        "left over: ['meta-llama/x']"
    assert parse_as_tuned(["bench", "--engine", "gpu", "--out", "x"]) == (
        "tuned bench: argument --engine: invalid choice: 'gpu' (choose from 'sim', 'vllm') "
        "(see tuned bench --help)")
    assert parse_as_tuned(["status", "--", "--dtype", "float32"]) == \
        "status takes no arguments after --"


def test_a_documented_model_is_what_the_help_says_model_takes():
    """The README runs `tuned profile --model meta-llama/Llama-2-7b-hf`: the help of
    every subcommand shown with a Hugging Face id says it takes one."""
    from tuned.base.demo_model import model_form

    def form(model: str) -> str:
        try:
            return model_form(model)
        except ValueError:
            return "folder"  # a folder on the operator's host, not this one

    subs = _subcommands()
    shown = {(argv[0], argv[argv.index("--model") + 1]) for _, argv in tuned_commands()
             if "--model" in argv[:-1]}
    hf = {sub for sub, model in shown if not model.isupper() and form(model) == "hf_id"}
    assert hf >= {"profile"}, shown
    for sub in hf:
        [action] = [a for a in subs[sub]._actions if "--model" in a.option_strings]
        assert "Hugging Face id" in action.help, (sub, action.help)


# ------------------------------------------------------------------ metric names

def exported_names() -> set[str]:
    """The names a Prometheus query uses for each series tuned's metrics module
    declares (whether or not a labelled family has a child yet), and the gateway's
    series, which vLLM's own /metrics carries."""
    from tuned.engines.gateway import EXPORTED
    from tuned.control.metrics import Metrics

    names = set()
    for name, kind in EXPORTED.items():
        names |= {name} | ({name + s for s in ("_bucket", "_sum", "_count")}
                           if kind == "histogram" else set())
    for fam in Metrics().exported.collect():
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names |= {fam.name} | {fam.name + s for s in ("_bucket", "_sum", "_count")}
        elif fam.type == "info":
            names.add(fam.name + "_info")
        else:
            names.add(fam.name)
    return names


def log_events() -> set[str]:
    """``tuned_*`` log event names (``log.info("tuned_started", ...)``) in tuned's code."""
    found = set()
    for py in (ROOT / "tuned").rglob("*.py"):
        found |= set(re.findall(r'\blog\.(?:debug|info|warning|error)\(\s*"(tuned_\w+)"',
                                py.read_text()))
    return found


def documented_names() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"\btuned_[a-z0-9_]+\*?", line):
                out.append((f"{_rel(path)}:{n}", m.group(0)))
    return out


def test_every_documented_metric_is_exported():
    from tuned.core.predictor import _HINTS

    exported = exported_names()
    known = exported | set(_HINTS) | MISSPELT_ON_PURPOSE | log_events()
    wrong = [(where, name) for where, name in documented_names()
             if not (name.rstrip("*") in known if not name.endswith("*") else
                     any(e.startswith(name.rstrip("*")) for e in exported))]
    assert wrong == []
    assert len({name for _, name in documented_names()} & exported) >= 30


def test_the_metric_check_catches_a_wrong_name():
    exported = exported_names()
    assert "tuned_queue_policy_info" in exported and "tuned_queue_policy" not in exported
    assert "tuned_reloads_total" in exported and "tuned_reloads" not in exported
    assert "tuned_tbt_seconds" in exported and "tuned_tbt_seconds_bucket" in exported
