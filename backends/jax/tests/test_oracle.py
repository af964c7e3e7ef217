"""The f64 oracle's closed-form gradient agrees with central finite differences of its loss.

This validates the oracle itself (independently of JAX), so the baseline comparison in
test_baseline.py checks against a gradient that is known to be right.
"""

import numpy as np
import pytest

from grpo_jax.spec import Problem
from helpers import make_inputs
from oracle import oracle

KNOBS = [
    dict(temperature=0.7, epsilon_low=0.2, epsilon_high=0.28, beta=0.04),
    dict(temperature=1.3, beta=0.1, delta=1.5, loss_type="dr_grpo", max_completion_length=10),
    dict(beta=0.04, loss_type="bnpo", importance_sampling_level="sequence"),
    dict(delta=1.4, loss_type="grpo", importance_sampling_level="sequence", temperature=0.8),
]


def _fd_check(inputs, knobs, level, name, grad_name, n=24, eps=1e-6):
    grad = oracle(inputs, knobs, level)[grad_name]
    rng = np.random.default_rng(7)
    base = {k: (np.asarray(x, np.float64) if k in ("logits", "hidden", "lm_head") else x)
            for k, x in inputs.items()}
    x = base[name]
    worst = 0.0
    ids = inputs["chosen_ids"]
    for i in range(n):
        idx = tuple(int(rng.integers(0, d)) for d in x.shape)
        if name == "logits" and i % 2:  # every other probe on a chosen id (the onehot term)
            idx = idx[:2] + (int(ids[idx[0], idx[1]]),)
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        lp = oracle({**base, name: plus}, knobs, level)["loss"]
        lm = oracle({**base, name: minus}, knobs, level)["loss"]
        worst = max(worst, abs((lp - lm) / (2 * eps) - grad[idx]))
    return worst, float(np.max(np.abs(grad)))


@pytest.mark.parametrize("knobs", KNOBS)
def test_oracle_dlogits_matches_finite_differences(knobs):
    problem = Problem("logits", 3, 6, 37, None, "f32")
    inputs = make_inputs(problem, seed=3)
    worst, scale = _fd_check(inputs, knobs, "logits", "logits", "dlogits")
    assert worst <= 1e-6 * max(scale, 1e-3), (worst, scale)


@pytest.mark.parametrize("grad_name,name", [("dhidden", "hidden"), ("dlm_head", "lm_head")])
def test_oracle_fused_gradients_match_finite_differences(grad_name, name):
    problem = Problem("fused", 3, 5, 29, 8, "f32")
    inputs = make_inputs(problem, seed=5)
    worst, scale = _fd_check(inputs, KNOBS[0], "fused", name, grad_name)
    assert worst <= 1e-6 * max(scale, 1e-3), (worst, scale)
