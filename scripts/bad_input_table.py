r"""Runs every bad input as a user would and writes the table of what replax says about each
(docs/bad_input.md).

  python scripts/bad_input_table.py --out=docs/bad_input.md

Each row is a real run of scripts/train.py (or export.py, evaluate.py) in a subprocess,
on the tests' 8 simulated CPU devices:
- settings: every entry of tests/config/test_build.py's BAD_SETTINGS, given as
  --config.KEY=VALUE flags to configs/arith.py on the micro run of tests/micro_run.py;
- files, workdirs and checkpoints: the inputs a user gets wrong on the command line.
The row shows the run's exit status, how many non-empty lines it printed on stderr, what
became of its workdir (and of export.py's --out) and the last of those lines. A row holds
when the status is 2, stderr has one line and the workdir was neither created nor changed;
when any row does not, the table is written all the same and the script lists those rows
and exits with status 1. Only the title, the intro lines and the table of --out are
rewritten: any sections below the table are kept.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TITLE = "# Bad input and what replax says"
# The 8 simulated devices of the tests; this checkout's replax; tests/ on the path for the
# user's task of tests/user_task.py, as a user's own package would be.
ENV = {
    **os.environ,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
    "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.join(ROOT, "tests"), ROOT, os.environ.get("PYTHONPATH")) if p
    ),
}


def _tests_module(path):
    """A module of tests/ by its path there (its case lists are the table's rows)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    name = os.path.basename(path)
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", f"{path}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The micro run of tests/micro_run.py, two steps.
MICRO = [
    *_tests_module("micro_run").MICRO,
    "--config.total_steps=2",
    "--config.checkpoint_every=2",
]


def _flag(key, value):
    """--config.KEY=VALUE as a user types it (strings bare, other values as Python writes
    them: 1.5, inf, (3, 1, 1), False)."""
    return f"--config.{key}={value if isinstance(value, str) else repr(value)}"


def _state(path):
    """What is at path: None if nothing, else the files and folders under it with the
    files' sizes and modification times (a created or rewritten file changes it)."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        st = os.stat(path)
        return [("", st.st_size, st.st_mtime_ns)]
    entries = []
    for folder, dirs, files in os.walk(path):
        for name in dirs:
            entries.append((os.path.relpath(os.path.join(folder, name), path), None, None))
        for name in files:
            full = os.path.join(folder, name)
            st = os.stat(full, follow_symlinks=False)
            entries.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return sorted(entries)


def _run(args, watch):
    """Runs `python *args` from the repository root. Returns (exit status, non-empty stderr
    lines, what became of the watched paths: 'not created', 'unchanged', 'created' or
    'changed')."""
    before = [_state(p) for p in watch]
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900
    )
    after = [_state(p) for p in watch]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if before == after:
        fate = "not created" if all(b is None for b in before) else "unchanged"
    elif any(b is None and a is not None for b, a in zip(before, after)):
        fate = "created"
    else:
        fate = "changed"
    return proc.returncode, lines, fate


def _train(workdir, *args, config="configs/arith.py"):
    return ["scripts/train.py", f"--config={config}", f"--workdir={workdir}", *args]


def _cases(tmp):
    """(bad input, the script and its arguments, the paths it must not create or change)."""
    cases = []
    for i, (overrides, _) in enumerate(_tests_module("config/test_build").BAD_SETTINGS):
        flags = [_flag(k, v) for k, v in overrides.items()]
        workdir = os.path.join(tmp, f"setting{i}")
        cases.append((" ".join(flags), _train(workdir, *MICRO, *flags), [workdir]))
    run, fresh = os.path.join(tmp, "run"), os.path.join(tmp, "fresh")
    file = os.path.join(tmp, "a_file")
    open(file, "w").close()
    bad_hf = os.path.join(tmp, "hf")
    os.makedirs(bad_hf)
    with open(os.path.join(bad_hf, "config.json"), "w") as f:
        json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, f)
    empty = os.path.join(tmp, "empty.jsonl")
    open(empty, "w").close()
    not_a_run = os.path.join(tmp, "not_a_run")
    os.makedirs(not_a_run)
    out = os.path.join(tmp, "out")
    long = _tests_module("long_prompts").write(os.path.join(tmp, "long_prompts"))
    gguf = os.path.join(tmp, "model.gguf")
    with open(gguf, "wb") as f:
        f.write(b"GGUF" + bytes(28))
    records = os.path.join(tmp, "records.jsonl")
    with open(records, "w") as f:
        f.writelines(
            json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(200)
        )
    reward_file = os.path.join(tmp, "my_reward.py")
    with open(reward_file, "w") as f:
        f.write("LIMIT = 3\n")
    no_tokenizer = os.path.join(tmp, "hf_without_tokenizer")
    os.makedirs(no_tokenizer)
    cases += [
        ("--config=configs/missing.py", _train(fresh, config="configs/missing.py"), [fresh]),
        (
            "--config=configs/arith.py:bogus",
            _train(fresh, config="configs/arith.py:bogus"),
            [fresh],
        ),
        ("--config.no_such_key=1", _train(fresh, "--config.no_such_key=1"), [fresh]),
        (
            "--config.rollout.group_sise=4 (a misspelt key)",
            _train(fresh, "--config.rollout.group_sise=4"),
            [fresh],
        ),
        (
            "a prompt longer than rollout.max_prompt_len (tests/long_prompts.py: a tiny "
            "Hugging Face tokenizer's chat prompts)",
            _train(fresh, config=f"tests/long_prompts.py:{long}"),
            [fresh],
        ),
        ("--config.total_steps=abc", _train(fresh, "--config.total_steps=abc"), [fresh]),
        ("--workdir is a file", _train(file, *MICRO), [file]),
        (
            "--workdir that cannot be created (/proc/self/run)",
            _train("/proc/self/run", *MICRO),
            ["/proc/self/run"],
        ),
        (
            "a workdir with a checkpoint of another config (model.d_model 32 -> 64)",
            _train(run, *MICRO, "--config.model.d_model=64"),
            [run],
        ),
        (
            "--config.model.checkpoint=/no/such/dir",
            _train(
                fresh,
                *MICRO[:6],
                "--config.model.init=checkpoint",
                "--config.model.checkpoint=/no/such/dir",
            ),
            [fresh],
        ),
        (
            "a checkpoint of an unsupported architecture (GPT-2)",
            _train(fresh, "--config.model.init=checkpoint", f"--config.model.checkpoint={bad_hf}"),
            [fresh],
        ),
        (
            "--config.task.name=no_such_module:make_task",
            _train(fresh, "--config.task.name=no_such_module:make_task"),
            [fresh],
        ),
        (
            "an empty GSM8K data file (configs/gsm8k.py --config.task.data_path=EMPTY)",
            _train(
                fresh,
                "--config.model.init=random",
                "--config.tokenizer.name=byte",
                "--config.task.prompt_format=plain",
                f"--config.task.data_path={empty}",
                config="configs/gsm8k.py",
            ),
            [fresh],
        ),
        (
            "--config.model.checkpoint=FILE.gguf (a llama.cpp file, not a directory)",
            _train(fresh, "--config.model.init=checkpoint", f"--config.model.checkpoint={gguf}"),
            [fresh],
        ),
        (
            "a GSM8K data file that does not exist (configs/gsm8k.py)",
            _train(
                fresh,
                "--config.model.init=random",
                "--config.tokenizer.name=byte",
                "--config.task.prompt_format=plain",
                f"--config.task.data_path={os.path.join(tmp, 'no_such.jsonl')}",
                config="configs/gsm8k.py",
            ),
            [fresh],
        ),
        (
            "configs/jsonl.py --config.task.data_path of no file",
            _train(
                fresh,
                f"--config.task.data_path={os.path.join(tmp, 'no.jsonl')}",
                config="configs/jsonl.py",
            ),
            [fresh],
        ),
        (
            "configs/jsonl.py --config.task.reward=FILE.py:FN of no function",
            _train(
                fresh,
                f"--config.task.data_path={records}",
                f"--config.task.reward={reward_file}:nothing",
                config="configs/jsonl.py",
            ),
            [fresh],
        ),
        (
            "export.py on a directory that is not a run",
            ["scripts/export.py", f"--workdir={not_a_run}", f"--out={out}"],
            [not_a_run, out],
        ),
        (
            "export.py --step of no checkpoint",
            ["scripts/export.py", f"--workdir={run}", f"--out={out}", "--step=7"],
            [run, out],
        ),
        (
            "evaluate.py on a directory that is not a run",
            ["scripts/evaluate.py", f"--workdir={not_a_run}"],
            [not_a_run],
        ),
        (
            "evaluate.py --step of no checkpoint",
            ["scripts/evaluate.py", f"--workdir={run}", "--step=7"],
            [run],
        ),
        (
            "evaluate.py on a run with a setting its checkpoint fixes",
            ["scripts/evaluate.py", f"--workdir={run}", "--config.model.d_model=64"],
            [run],
        ),
        (
            "evaluate.py --config on a workdir that does not exist",
            ["scripts/evaluate.py", f"--workdir={fresh}", "--config=configs/arith.py"],
            [fresh],
        ),
        (
            "evaluate.py --checkpoint of a directory without tokenizer.json, no --config",
            ["scripts/evaluate.py", f"--checkpoint={no_tokenizer}"],
            [no_tokenizer],
        ),
        (
            "evaluate.py --checkpoint of no directory",
            ["scripts/evaluate.py", "--checkpoint=/no/such/dir", "--config=configs/arith.py"],
            [],
        ),
    ]
    return cases


def _table_and_rest(path):
    """The lines of path below its first table (kept as they are), or none."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return [line for line in lines if line != TITLE]
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[end:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "bad_input.md"))
    args = parser.parse_args()
    start = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # The run the workdir and export rows start from.
        code, lines, _ = _run(_train(os.path.join(tmp, "run"), *MICRO), [])
        if code != 0:
            sys.exit(f"the micro run failed (exit {code}): {lines[-1] if lines else ''}")
        for name, command, watch in _cases(tmp):
            code, lines, fate = _run(command, watch)
            message = lines[-1].removeprefix("error: ") if lines else ""
            rows.append((name, code, len(lines), fate, message.replace(tmp, "TMP")))
            print(f"{code} {len(lines)} {fate:11} {name}", flush=True)
    failing = [
        r for r in rows if r[1] != 2 or r[2] != 1 or r[3] not in ("not created", "unchanged")
    ]
    minutes = (time.time() - start) / 60
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    holds = len(rows) - len(failing)
    lines = [
        TITLE,
        "",
        f"{len(rows)} bad inputs, each run as a user would run it: scripts/train.py (or",
        "export.py, evaluate.py) in a subprocess on 8 simulated CPU devices; the settings rows are",
        "tests/config/test_build.py's BAD_SETTINGS given as flags to configs/arith.py's micro",
        "run. Each row shows the exit status, the number of non-empty lines on stderr, what",
        "became of the workdir (TMP is the temporary folder of the rows) and the last stderr",
        "line. The contract is exit status 2, one line, and the workdir neither created nor",
        f"changed (a workdir that already holds a run keeps it as it was): {holds} of",
        f"{len(rows)} rows hold it. Made at commit {commit} by",
        f"`python scripts/bad_input_table.py --out=docs/bad_input.md` ({minutes:.0f} minutes).",
        "",
        "| bad input | exit | stderr lines | workdir | message |",
        "|---|---|---|---|---|",
    ]
    for name, code, count, fate, message in rows:
        lines.append(f"| `{name}` | {code} | {count} | {fate} | {message.replace('|', '/')} |")
    rest = _table_and_rest(args.out)
    with open(args.out, "w") as f:
        f.write("\n".join(lines + rest) + "\n")
    print(f"{len(rows)} rows ({holds} hold) -> {args.out} in {minutes:.1f} minutes")
    if failing:
        for name, code, count, fate, message in failing:
            print(
                f"does not hold: {name}: exit {code}, {count} stderr lines, workdir {fate}: "
                f"{message}",
                file=sys.stderr,
            )
        sys.exit(1)


if __name__ == "__main__":
    main()
