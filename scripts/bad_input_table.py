r"""Writes the table of bad inputs and what replax says about each (docs/bad_input.md).

  python scripts/bad_input_table.py --out=docs/bad_input.md

Two kinds of rows, each from the code as it is:
- settings: every entry of tests/test_configuration.py's BAD_SETTINGS, validated in
  process on the embedded default's micro config; the row shows the one-line message.
- files, workdirs and checkpoints: scripts/train.py (or export.py) run as a user would,
  the row shows its exit status and the line it printed on stderr.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The 8 simulated devices of the tests, for this process and the runs it starts.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _tests_module(name):
    """A module of tests/ (its case lists are the table's rows)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The micro run of tests/test_trainer.py, two steps.
MICRO = [
    *_tests_module("test_trainer").MICRO,
    "--config.total_steps=2",
    "--config.checkpoint_every=2",
]


def _settings_rows():
    module = _tests_module("test_configuration")
    from replax import configuration
    from replax.config_utils import ConfigError

    rows = []
    for overrides, _ in module.BAD_SETTINGS:
        try:
            configuration.validate(module.config(**overrides))
            message = "(accepted)"
        except ConfigError as e:
            message = str(e)
        setting = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        rows.append((setting, "2", message))
    return rows


def _train(workdir, *args, script="scripts/train.py", config="configs/arith.py"):
    cmd = [sys.executable, script, f"--config={config}", f"--workdir={workdir}", *args]
    if script != "scripts/train.py":
        cmd = [sys.executable, script, f"--workdir={workdir}", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return proc.returncode, (lines[-1] if lines else "")


def _file_rows(tmp):
    rows = []
    run = os.path.join(tmp, "run")
    code, _ = _train(run, *MICRO)
    assert code == 0, "the micro run failed"
    file = os.path.join(tmp, "a_file")
    open(file, "w").close()
    bad_hf = os.path.join(tmp, "hf")
    os.makedirs(bad_hf)
    with open(os.path.join(bad_hf, "config.json"), "w") as f:
        json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, f)
    cases = [
        ("--config=configs/missing.py", lambda: _train(run, config="configs/missing.py")),
        ("--config=configs/arith.py:bogus", lambda: _train(run, config="configs/arith.py:bogus")),
        (
            "--config.no_such_key=1",
            lambda: _train(os.path.join(tmp, "x"), "--config.no_such_key=1"),
        ),
        (
            "--config.total_steps=abc",
            lambda: _train(os.path.join(tmp, "x"), "--config.total_steps=abc"),
        ),
        ("--workdir is a file", lambda: _train(file, *MICRO)),
        ("--workdir not writable (/proc/self/run)", lambda: _train("/proc/self/run", *MICRO)),
        (
            "a workdir with a checkpoint of another config (model.d_model 32 -> 64)",
            lambda: _train(run, *MICRO, "--config.model.d_model=64"),
        ),
        (
            "--config.model.checkpoint=/no/such/dir",
            lambda: _train(
                os.path.join(tmp, "y"),
                *MICRO[:6],
                "--config.model.init=checkpoint",
                "--config.model.checkpoint=/no/such/dir",
            ),
        ),
        (
            "a checkpoint of an unsupported architecture (GPT-2)",
            lambda: _train(
                os.path.join(tmp, "y"),
                "--config.model.init=checkpoint",
                f"--config.model.checkpoint={bad_hf}",
            ),
        ),
        (
            "--config.task.name=no_such_module:make_task",
            lambda: _train(os.path.join(tmp, "y"), "--config.task.name=no_such_module:make_task"),
        ),
        (
            "export.py on a directory that is not a run",
            lambda: _train(tmp, f"--out={tmp}/out", script="scripts/export.py"),
        ),
        (
            "export.py --step of no checkpoint",
            lambda: _train(run, f"--out={tmp}/out", "--step=7", script="scripts/export.py"),
        ),
    ]
    for name, call in cases:
        code, line = call()
        rows.append((name, str(code), line.removeprefix("error: ")))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "bad_input.md"))
    args = parser.parse_args()
    rows = _settings_rows()
    with tempfile.TemporaryDirectory() as tmp:
        rows += _file_rows(tmp)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Bad input and what replax says",
        "",
        f"{len(rows)} bad inputs, each answered with one line and exit status 2 before any",
        "compute, nothing written to the workdir (a workdir that already holds a run keeps",
        "it as it was). Made at commit "
        f"{commit} by `python scripts/bad_input_table.py --out=docs/bad_input.md`.",
        "",
        "| bad input | exit | message |",
        "|---|---|---|",
    ]
    for name, code, message in rows:
        lines.append(f"| `{name}` | {code} | {message.replace('|', '/')} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()
