"""Tests for scripts/compare.py end to end: bad flags exit 2 before any run, and a study on
a micro config (the study engine's units: tests/tools/test_study_*.py,
test_lr_selection.py)."""

import importlib.util
import json
import os

import pytest

from replax.tools import experiments as ex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = load_script("compare")


def test_override_parsing_and_bad_flags(tmp_path, capsys):
    config = ex.load_config(os.path.join(ROOT, "configs/arith.py"), "replay")
    ex.set_value(config, "replay.capacity", "128")
    ex.set_value(config, "replay.drop_zero_advantage", "false")
    ex.set_value(config, "optimizer.learning_rate", "1e-4")
    assert config.replay.capacity == 128 and config.replay.drop_zero_advantage is False
    assert config.optimizer.learning_rate == 1e-4
    assert ex.split_override("replay:train.batch_size=32") == ("replay", "train.batch_size", "32")
    assert ex.split_override("eval.every=3") == (None, "eval.every", "3")
    assert compare.main([f"--workdir={tmp_path / 'a'}", "--override=no.such=1"]) == 2
    assert compare.main([f"--workdir={tmp_path / 'b'}", "--variants=onpolicy,nope"]) == 2
    assert compare.main([f"--workdir={tmp_path / 'b'}", f"--reuse={tmp_path / 'none'}"]) == 2
    assert "--reuse=" in capsys.readouterr().err
    # The final re-evaluation's pass@k batch (3 prompts x pass_k 2) does not split over the
    # 8 data shards: refused before any run, with the flag named.
    micro = [f"--override={o}" for o in MICRO]
    workdir = tmp_path / "c"
    assert compare.main([f"--workdir={workdir}", "--final_pass_k_prompts=3", *micro]) == 2
    assert "--final_pass_k_prompts=3" in capsys.readouterr().err
    assert not (workdir / "runs").exists()
    # So do the transfer's 4 prompts, and a transfer file that is not there.
    questions = tmp_path / "gsm8k_test.jsonl"
    write_questions(questions, 12)
    for flags, named in (
        ([f"--transfer_gsm8k={questions}", "--transfer_prompts=4"], "eval.num_prompts=4"),
        ([f"--transfer_gsm8k={tmp_path / 'none.jsonl'}"], "none.jsonl"),
        ([f"--transfer_gsm8k={questions}", "--transfer_prompts=16"], "fewer than 16"),
    ):
        assert compare.main([f"--workdir={workdir}", *flags, *micro]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --transfer_gsm8k, variant onpolicy: ") and named in err, err
        assert not (workdir / "runs").exists()


def test_bad_config_flags_exit_2(tmp_path, capsys):
    """--config=FILE[:ARG] and --config.KEY=VALUE refused as scripts/train.py refuses them:
    exit 2, one line naming the flag (the flags' effect: tests/tools/test_study_plan.py)."""
    for bad, words in (
        ("--config.no_such_key=1", "no_such_key"),
        ("--config.replay.capacity=abc", "invalid literal"),
        ("--seeds=0", "--seeds"),
        ("--config=configs/missing.py", "no such file"),
    ):
        assert compare.main([f"--workdir={tmp_path / 'x'}", bad]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert words in line, line
    # An ARG of the file goes before each variant's parts: arith.py's variants are whole.
    assert compare.main([f"--workdir={tmp_path / 'x'}", "--config=configs/arith.py:replay"]) == 2
    assert "config variant 'replay,onpolicy'" in capsys.readouterr().err


# A micro run (tests/run/test_trainer.py's MICRO): 8 simulated devices divide every batch.
MICRO = [
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.head_dim=16",
    "model.mlp_dim=64",
    "warmstart.max_steps=4",
    "warmstart.eval_every=4",
    "task.num_train=64",
    "task.num_test=16",
    "rollout.group_size=4",
    "eval.num_prompts=16",
    "eval.pass_k=2",
    "eval.pass_k_prompts=8",
    "log_every=1",
    # On-policy: R = B = N = 16. Replay: R = 8, B = 16, N = 32.
    "onpolicy:rollout.prompts_per_step=4",
    "onpolicy:train.batch_size=16",
    "onpolicy:replay.capacity=16",
    "replay:rollout.prompts_per_step=2",
    "replay:train.batch_size=16",
    "replay:replay.capacity=32",
]


def write_questions(path, num):
    """A GSM8K-format file of `num` questions, the i-th of length growing with i."""
    with open(path, "w") as f:
        for i in range(num):
            question = f"What is {i} + {i}?" + " Think." * (i % 5)
            f.write(json.dumps({"question": question, "answer": f"{i}+{i}\n#### {2 * i}"}) + "\n")


def test_compare_end_to_end_on_a_micro_config(tmp_path, capsys):
    workdir = tmp_path / "cmp"
    questions = tmp_path / "gsm8k_test.jsonl"
    write_questions(questions, 40)
    study = [
        "--lr_grid=onpolicy:1e-4;replay:3e-5",
        "--budget_rollouts=64",
        "--num_evals=2",
        "--final_pass_k_prompts=12",
        f"--transfer_gsm8k={questions}",
        "--transfer_prompts=16",
        "--transfer_max_new_tokens=8",
        "--transfer_max_prompt_len=64",
        *[f"--override={o}" for o in MICRO],
    ]
    kept = tmp_path / "kept"
    # --reuse names the directory runs are kept in before it exists, as a first study does.
    argv = [f"--workdir={workdir}", "--seeds=2", f"--commit_runs={kept}", f"--reuse={kept}"]
    argv += study
    assert compare.main(argv) == 0
    payload = json.loads((workdir / "compare.json").read_text())
    for key in (
        "variants",
        "mu_measured",
        "mu_model",
        "inference_ratio",
        "compute_ratio",
        "compute_ratio_at_mu_measured",
        "lr_grid",
        "lr_chosen",
        "target_accuracy",
        "command",
        "machine",
    ):
        assert key in payload, key
    assert payload["mu_model"] == 6.0
    assert payload["machine"]["cpu_count"] and payload["machine"]["load_average_end"]
    for name, steps in (("onpolicy", 4), ("replay", 8)):
        v = payload["variants"][name]
        for key in (
            "final_accuracy",
            "pass_at_k",
            "entropy",
            "gen_tokens",
            "wall_s",
            "gen_s",
            "train_s",
            "gen_tokens_to_target",
            "cost_to_target",
            "per_seed",
            "iqr",
        ):
            assert key in v, (name, key)
        assert v["seeds"] == [0, 1] and v["total_steps"] == steps
        assert len(v["per_seed"]["final_accuracy"]) == 2
        # pass@k and entropy come from the re-evaluation of each run's last checkpoint,
        # whose greedy accuracy is the run's own final one.
        for seed, run_dir in zip(v["seeds"], v["run_dirs"]):
            final = json.loads((workdir / run_dir / "final_eval_pass12.json").read_text())
            assert final["step"] == steps
            assert v["per_seed"]["pass_at_k"][seed] == final["eval_pass_at_k"]
            assert v["per_seed"]["entropy"][seed] == final["entropy"]
            assert v["per_seed"]["final_accuracy"][seed] == final["eval_accuracy"]
    assert payload["final_pass_k_prompts"] == 12
    assert payload["variants"]["onpolicy"]["B"] == payload["variants"]["onpolicy"]["R"] == 16
    assert payload["lr_chosen"] == {"onpolicy": 1e-4, "replay": 3e-5}
    assert (workdir / "compare.png").stat().st_size > 10_000
    assert (workdir / "compare_entropy.png").stat().st_size > 10_000
    assert len(payload["paper_table"]["rows"]) == 3 and len(payload["entropy_levels"]) == 5
    for v in payload["variants"].values():
        assert (v["placement"], v["W"], v["T"]) == ("colocated", 0, 8)
        assert v["device_s"] == pytest.approx(8 * v["wall_s"])
        assert set(v["entropy_at_accuracy"]) == {f"{a:.4g}" for a in payload["entropy_levels"]}
        for key in ("entropy_at_target", "device_s_to_target", "wall_s_to_target"):
            assert key in v, key
    assert "| onpolicy |" in (workdir / "compare.md").read_text()
    # One warm start per seed, shared by both variants; one dataset.
    assert len(os.listdir(workdir / "base")) == 2
    # Each run's transfer is measured as soon as it finishes, while its checkpoints are on
    # this machine, and kept at once; the base's at the end.
    said = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("running", "transfer:"))
    ]
    runs = [
        f"{v}/lr{lr}/seed{seed}"
        for v, lr in (("onpolicy", "0.0001"), ("replay", "3e-05"))
        for seed in (0, 1)
    ]
    assert len(said) == 9, said
    for i, run in enumerate(runs):
        assert said[2 * i].startswith("running") and f"/runs/{run} (" in said[2 * i], said
        assert said[2 * i + 1].endswith(f"/runs/{run}/transfer_gsm8k16.json"), said
    assert said[-1].endswith("/transfer_base_gsm8k16.json"), said
    # A rerun skips the finished runs.
    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("done already") == 6  # the selection seed is asked twice
    assert "final evaluation" not in out and "transfer:" not in out  # cached

    # THE TRANSFER: the 16 shortest questions, greedy, of the base and of each chosen run.
    transfer = payload["transfer"]
    assert (transfer["prompts"], transfer["data"]) == (16, "gsm8k_test.jsonl")
    assert 0 <= transfer["base"] <= 1
    for name in payload["variants"]:
        accs = transfer["variants"][name]["per_seed"]
        assert len(accs) == 2 and all(0 <= a <= 1 for a in accs)
    shortest = (workdir / "transfer" / "gsm8k_shortest16.jsonl").read_text().splitlines()
    assert [len(json.loads(line)["question"]) for line in shortest] == sorted(
        len(f"What is {i} + {i}?" + " Think." * (i % 5)) for i in range(40)
    )[:16]
    assert (
        "Transfer (not a target): greedy accuracy on the 16 shortest"
        in (workdir / "compare.md").read_text()
    )

    # KEPT RUNS: each run's small files under kept/RUN_NAME, and a study assembled from
    # them alone, elsewhere, runs nothing and has the same figures.
    names = sorted(os.listdir(kept))
    assert "transfer_base_gsm8k16.json" in names
    runs = [n for n in names if not n.endswith(".json")]
    assert [n.rsplit("_", 1)[0] for n in runs] == [
        "onpolicy_lr0.0001_seed0",
        "onpolicy_lr0.0001_seed1",
        "replay_lr3e-05_seed0",
        "replay_lr3e-05_seed1",
    ]
    for name in runs:
        assert "checkpoints" not in os.listdir(kept / name)
        assert {"metrics.jsonl", "config.json", "summary.json", "final_eval_pass12.json",
                "transfer_gsm8k16.json"} <= set(os.listdir(kept / name))  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    report = tmp_path / "docs" / "study_compare"
    again = [f"--workdir={elsewhere}", "--seeds=2", f"--reuse={kept}", "--assemble_only"]
    capsys.readouterr()
    assert compare.main([*again, f"--report={report}", *study]) == 0
    out = capsys.readouterr().out
    assert out.count("reused:") == 6 and "running" not in out
    assembled = json.loads((tmp_path / "docs" / "study_compare.json").read_text())
    assert (tmp_path / "docs" / "study_compare.md").read_text() == (
        elsewhere / "compare.md"
    ).read_text()

    def figures(p):
        p = {k: v for k, v in p.items() if k not in ("command", "machine", "wall_s")}
        p["variants"] = {
            name: {k: x for k, x in v.items() if k != "run_dirs"}
            for name, v in p["variants"].items()
        }
        return p

    assert figures(assembled) == figures(payload)
    # A third seed is not kept: --assemble_only names it and runs nothing.
    assert compare.main([*again[:-1], "--seeds=3", "--assemble_only", *study]) == 2
    err = capsys.readouterr().err
    assert "--assemble_only: no finished run onpolicy_lr0.0001_seed2_" in err
    assert not (elsewhere / "runs").exists()
