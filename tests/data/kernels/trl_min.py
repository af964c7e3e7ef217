"""jax_baseline with TRL's clipped surrogate, `-min(r·A, clip(r)·A)`, instead of SPEC's branch
rule: equal values everywhere, but half the gradient where a ratio sits exactly on a clip
edge (the minimum's tie rule). tests/external.rs checks that the FAIL line says so."""

import dataclasses

import jax.numpy as jnp

from grpo_jax.impls import baseline, grpo_math


def _trl_pg(log_r, advantages, k):
    r = jnp.exp(log_r)
    a = advantages[:, None]
    r_d = r if k.delta is None else jnp.minimum(r, k.delta)
    r_c = jnp.clip(r, 1.0 - k.epsilon_low, 1.0 + k.epsilon_high)
    return -jnp.minimum(r_d * a, r_c * a), r


def _build(problem, knobs, options):
    inner = baseline.IMPLEMENTATION.build(problem, knobs, options)

    def fn(*args):
        saved = grpo_math.clipped_pg
        grpo_math.clipped_pg = _trl_pg
        try:
            return inner(*args)
        finally:
            grpo_math.clipped_pg = saved

    return fn


IMPL = dataclasses.replace(baseline.IMPLEMENTATION, id="trl_min", build=_build)
