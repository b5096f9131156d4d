"""Every `python scripts/NAME.py ...` command in README.md's and docs/'s code blocks parses
as written on a fresh clone: the script exists, each flag is one it defines, each config
file and variant loads and each `--config.KEY=VALUE` names a key of it. Commands with
placeholders (DIR, FILE, $VAR, ..., /path/) and optional parts in [brackets] are taken
without those parts or left out; running them is the business of the tests of each
script."""

import collections
import json
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLACEHOLDERS = ("...", "$", "/path/", "DIR", "FILE", "CONFIG", "TOPOLOGY", "<", "|", "&&")

# Parses each argv with the script's own parser, in a process of its own per script: the
# script is imported (its main does not run) and its parser takes the argv, which loads
# the config file and applies its overrides.
PARSE = """
import contextlib, io, json, runpy, sys
from absl import flags
script, argvs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, "scripts")
sys.argv = [script]
ns = runpy.run_path(script, run_name="doc_commands")
errors = []
for argv in argvs:
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            if "parse_args" in ns:  # compare.py, sweep.py: argparse-like, own FlagValues
                ns["parse_args"](argv)
            else:  # train.py, tpu_compile.py, ...: absl's flags_parser
                for name in [n for n in flags.FLAGS if n.split(".")[0] == "config"]:
                    delattr(flags.FLAGS, name)  # the last command's config and overrides
                flags.FLAGS.unparse_flags()
                ns["_parse"]([script, *argv])
    except BaseException as e:
        why = said.getvalue().strip() or f"{type(e).__name__}: {e}"
        errors.append(f"{script} {' '.join(argv)}: {why.splitlines()[0]}")
print(json.dumps(errors))
"""


def doc_commands() -> dict[str, list[list[str]]]:
    """script -> the argvs its commands in the README and docs/ give it."""
    out = collections.defaultdict(list)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", page.read_text())  # continued lines joined
        for line in text.splitlines():
            match = re.search(r"python3? (scripts/\w+\.py)(.*)$", line)
            if not line.startswith("    ") or not match:
                continue
            rest = re.sub(r"\[--[^\]]*\]", "", match.group(2))  # optional flags left out
            if any(p in rest for p in PLACEHOLDERS):
                continue
            rest = rest.strip()
            if rest.count('"') % 2 or rest.count("'") % 2:
                rest = rest[:-1]  # the closing quote of a command run through ssh or bash -c
            out[match.group(1)].append(shlex.split(rest))
    return out


def test_the_docs_give_commands_to_check():
    commands = doc_commands()
    assert {"scripts/train.py", "scripts/compare.py", "scripts/tpu_compile.py"} <= set(commands)
    assert sum(len(v) for v in commands.values()) >= 20


def test_every_doc_command_parses_as_written():
    errors = []
    for script, argvs in sorted(doc_commands().items()):
        assert (ROOT / script).is_file(), f"{script}: no such script"
        proc = subprocess.run(
            [sys.executable, "-c", PARSE, script, json.dumps(argvs)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        errors += json.loads(proc.stdout.strip().splitlines()[-1])
    assert not errors, "\n".join(errors)
