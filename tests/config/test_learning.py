"""Tests for replax/config/learning.py: the sections of how a run learns. The checks every
section shares (keys held, allowed values, numeric bounds) run over these sections too in
tests/config/test_sections.py; here, the rules of the eval section's row blocks and of the
covariance options."""

import pytest
from test_sections import build, raises_one_line


def eval_rows_allowed(num_prompts, max_rows, pass_k, pass_k_prompts):
    """Whether max_rows splits evaluation into equal calls: those of the greedy pass (one
    row a prompt) and those of pass@k (pass_k rows a prompt, whole prompts a call)."""
    if not max_rows:
        return True
    if num_prompts > max_rows and num_prompts % max_rows:
        return False
    prompts = min(pass_k_prompts, num_prompts)
    if pass_k and prompts * pass_k > max_rows:
        per_call = max_rows // pass_k
        return max_rows % pass_k == 0 and per_call > 0 and prompts % per_call == 0
    return True


def test_eval_max_rows_splits_both_passes_into_equal_calls():
    checked = 0
    for num_prompts in (4, 6, 8, 12):
        for max_rows in (0, 2, 3, 4, 8, 16):
            for pass_k in (0, 2, 3):
                for pass_k_prompts in (2, 4, 8):
                    values = dict(
                        num_prompts=num_prompts,
                        max_rows=max_rows,
                        pass_k=pass_k,
                        pass_k_prompts=pass_k_prompts,
                    )
                    if not eval_rows_allowed(**values):
                        assert raises_one_line("eval", **values).startswith(
                            f"eval.max_rows={max_rows}: must"
                        )
                        continue
                    section = build("eval", **values)
                    rows = min(pass_k_prompts, num_prompts) * pass_k
                    assert section.pass_k_rows == rows
                    passes = [(num_prompts, 1)] + ([(rows // pass_k, pass_k)] if pass_k else [])
                    for prompts, per_prompt in passes:
                        blocks = section.blocks(prompts, per_prompt)
                        if max_rows and prompts * per_prompt > max_rows:
                            assert blocks * max_rows == prompts * per_prompt
                        else:
                            assert blocks == 1
                    checked += 1
    assert checked > 50  # most combinations are allowed, and each is checked


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"clip_cov_ratio": 1e-3, "cov_cut_frac": 0.2}, "at most one"),
        ({"kl_cov_frac": 1e-3, "cov_cut_frac": 0.2}, "at most one"),
        ({"clip_cov_ratio": 1e-3, "clip_cov_low": 5.0, "clip_cov_high": 1.0}, "clip_cov_low"),
    ],
)
def test_covariance_options_one_at_a_time_and_an_ordered_band(changes, message):
    assert message in raises_one_line("loss", **changes)
    on = {k: (0.0 if k == "cov_cut_frac" else v) for k, v in changes.items()}
    if "clip_cov_low" not in changes:
        assert build("loss", **on).cov_cut_frac == 0.0
