"""Tests for replax/run/assemble.py: with task.long_prompts='skip' the run's data leaves out the
prompts longer than rollout.max_prompt_len, counts them, and the trainer reports them."""

import long_prompts
import numpy as np

from replax.config import spec as spec_lib
from replax.run import assemble as run_lib
from replax.run import trainer


def test_skipped_prompts_leave_the_data_and_are_reported(tmp_path):
    c = long_prompts.get_config(long_prompts.write(str(tmp_path)))
    c.task.long_prompts = "skip"
    spec = spec_lib.parse(c)
    run = run_lib.build(spec, str(tmp_path / "run"))
    data = run_lib.prepare_data(run)
    assert data.skipped_prompts == {"train": (1, 9)}
    assert data.skipped_line(16) == (
        "1 of 9 train prompts longer than max_prompt_len=16 were skipped"
    )
    # One epoch (8 prompts, 4 batches of 2): each kept record once, the long one never.
    batches = [batch for _, batch in zip(range(4), iter(data.prompts))]
    answers = sorted(str(a) for b in batches for a in b["answer"])
    assert answers == sorted(str(i) for i in range(9) if i != long_prompts.LONG_INDEX)
    assert sorted(int(i) for b in batches for i in b["index"]) == list(range(8))
    assert len(data.evaluator.examples) == 8  # no held-out prompt was long

    # The run says so and records the counts in its summary.
    lines = []
    summary = trainer.train(spec, str(tmp_path / "run"), log=lines.append)
    assert "1 of 9 train prompts longer than max_prompt_len=16 were skipped" in lines
    assert summary["skipped_prompts"] == {"train": (1, 9)}
    assert np.isfinite(summary["final_accuracy"])
