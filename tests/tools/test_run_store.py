"""Tests for replax/tools/run_store.py: which settings make two runs the same run, and which of a
run's files are kept."""

import json
import os

from replax.tools import run_store


def config(**changes):
    c = {
        "seed": 0,
        "optimizer": {"learning_rate": 1e-5},
        "model": {"checkpoint": "/machine/a/model", "num_layers": 2},
        "task": {"name": "word_problems", "data_dir": "/machine/a/data"},
        "warmstart": {"cache_dir": "/machine/a/base"},
        "log": {"print_every_s": 60.0},
        "loss": {"cov_clip_frac": 0.0},
    }
    for key, value in changes.items():
        section, leaf = key.split("__")
        c[section][leaf] = value
    return c


def test_fingerprint_ignores_where_things_lie_and_not_what_a_run_is():
    base = run_store.fingerprint(config())
    elsewhere = config(
        model__checkpoint="/machine/b/model",
        task__data_dir="/b/data",
        warmstart__cache_dir="/b/base",
        log__print_every_s=5.0,
    )
    assert run_store.fingerprint(elsewhere) == base
    assert run_store.fingerprint(config(optimizer__learning_rate=3e-5)) != base
    assert run_store.fingerprint(config(loss__cov_clip_frac=0.2)) != base
    assert run_store.fingerprint({**config(), "seed": 1}) != base
    # A config.json written before a setting existed is the run with its old value.
    old = config()
    del old["loss"]["cov_clip_frac"]
    assert run_store.fingerprint(old) == base
    # Tuples (a spec's) and lists (its config.json) are one setting.
    assert run_store.fingerprint({**config(), "mesh": (1, -1)}) == run_store.fingerprint(
        {**config(), "mesh": [1, -1]}
    )
    name = run_store.run_name("replay", 1e-5, 2, config())
    assert name == f"replay_lr1e-05_seed2_{base}"


def test_keep_copies_the_small_files_and_index_finds_them(tmp_path):
    run = tmp_path / "study" / "runs" / "replay" / "lr1e-05" / "seed0"
    (run / "checkpoints" / "10").mkdir(parents=True)
    for name in ("metrics.jsonl", "summary.json", "final_eval_pass64.json", "samples.jsonl"):
        (run / name).write_text("{}\n")
    (run / "transfer_gsm8k64.json").write_text("{}")
    (run / "config.json").write_text(json.dumps(config()))
    kept = tmp_path / "kept" / run_store.run_name("replay", 1e-5, 0, config())
    copied = run_store.keep(str(run), str(kept))
    assert copied == [
        "config.json",
        "final_eval_pass64.json",
        "metrics.jsonl",
        "summary.json",
        "transfer_gsm8k64.json",
    ]
    assert sorted(os.listdir(kept)) == copied  # no checkpoints, no samples
    assert run_store.keep(str(kept), str(kept)) == []
    # Found by settings at any depth; the first root wins.
    found = run_store.index([str(tmp_path / "kept"), str(tmp_path / "study")])
    assert found == {run_store.fingerprint(config()): str(kept)}
    assert run_store.index([str(tmp_path / "study")])[run_store.fingerprint(config())] == str(run)


def test_a_kept_run_and_a_plan_that_would_run_alike_share_the_fingerprint():
    # A run kept before replay.auto_min_y and warmstart.num_examples existed (migration
    # gives it 0 and 20,000) against today's plan (1, and 0: sized automatically).
    def run(mode="fixed", init="checkpoint", num_train=0, **settings):
        c = config()
        c["model"]["init"] = init
        c["task"]["num_train"] = num_train
        c["replay"] = {"mode": mode}
        for key, value in settings.items():
            section, leaf = key.split("__")
            c[section][leaf] = value
        return c

    kept = run()
    today = run(replay__auto_min_y=1.0, warmstart__num_examples=0)
    # Neither has an effect here (fixed replay, a checkpoint rather than a warm start).
    assert run_store.fingerprint(today) == run_store.fingerprint(kept)
    # The kept run's own fingerprint (and its folder's name) stays as it was.
    assert run_store.settings(kept)["replay.auto_min_y"] == 0.0
    assert run_store.settings(kept)["warmstart.num_examples"] == 20_000
    # Under auto replay the floor on y is part of the run.
    auto = run(mode="auto")
    assert run_store.fingerprint(run(mode="auto", replay__auto_min_y=1.0)) != (
        run_store.fingerprint(auto)
    )
    assert run_store.fingerprint(run(mode="auto", replay__auto_min_y=0.0)) == (
        run_store.fingerprint(auto)
    )
    # A warm start's pool: 0 is the train split as the task holds it (task.num_train), as
    # the trainer resolves it; 0 with the whole of a file stays 0 (its size is the data's).
    warm = run(init="warmstart", num_train=20_000)
    assert run_store.fingerprint(
        run(init="warmstart", num_train=20_000, warmstart__num_examples=0)
    ) == (run_store.fingerprint(warm))
    assert run_store.fingerprint(
        run(init="warmstart", num_train=7_000, warmstart__num_examples=0)
    ) != (run_store.fingerprint(run(init="warmstart", num_train=7_000)))
    assert (
        run_store.settings(run(init="warmstart", warmstart__num_examples=0))[
            "warmstart.num_examples"
        ]
        == 0
    )
