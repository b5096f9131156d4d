"""The halves of a batch: their parts of its gradient and the statistics auto replay reads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax.rl import halves


def test_half_batch_gradient_stats_against_numpy():
    # Loss of the batch = mean over its rows of w . x_i: a half's part is the sum of its
    # rows over the batch's 8, its own mean gradient the mean of its rows.
    rng = np.random.default_rng(0)
    features = rng.normal(size=(8, 3)).astype(np.float32)
    age = np.array([5, 0, 3, 1, 7, 0, 2, 6], np.int32)
    batch = {"features": jnp.asarray(features), "age": jnp.asarray(age)}

    def grad_fn(w, half, across):
        rows = across.sum(jnp.float32(half["features"].shape[0]))
        grads = jax.grad(lambda w: jnp.sum(half["features"] @ w) / rows)(w)
        whole = across.whole(half["features"])  # the batch's rows, in its order
        metrics = {
            "loss_max": jnp.max(whole),
            "loss": jnp.mean(whole),
            "whole_is_the_batch": jnp.all(whole == features).astype(jnp.float32),
            "own_is_the_half": jnp.all(across.own(whole) == half["features"]).astype(jnp.float32),
        }
        return grads, metrics, half["features"].shape[0] / rows

    grads, metrics, stats = jax.jit(halves.half_batch_gradient_stats, static_argnums=0)(
        grad_fn, jnp.zeros(3), batch
    )
    order = np.argsort(age, kind="stable")
    fresh, stale = features[order[:4]].mean(0), features[order[4:]].mean(0)
    np.testing.assert_allclose(grads, features.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["halves_cross"], fresh @ stale, rtol=1e-5)
    np.testing.assert_allclose(
        stats["halves_noise_fresh"], fresh @ fresh - fresh @ stale, rtol=1e-5
    )
    np.testing.assert_allclose(
        stats["halves_noise_stale"], stale @ stale - fresh @ stale, rtol=1e-5
    )
    assert float(stats["halves_age_fresh"]) == pytest.approx(np.mean([0, 0, 1, 2]))
    assert float(stats["halves_age_stale"]) == pytest.approx(np.mean([3, 5, 6, 7]))
    assert float(metrics["loss_max"]) == pytest.approx(features.max())
    assert float(metrics["loss"]) == pytest.approx(features.mean(), rel=1e-5)
    assert float(metrics["whole_is_the_batch"]) == 1.0
    assert float(metrics["own_is_the_half"]) == 1.0


def test_an_odd_batch_is_refused():
    batch = {"age": jnp.zeros(5, jnp.int32)}
    with pytest.raises(ValueError, match="batch size 5 is odd"):
        halves.half_batch_gradient_stats(lambda *a: None, jnp.zeros(1), batch)
