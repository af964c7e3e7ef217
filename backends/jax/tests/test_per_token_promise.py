"""interface.py's promise for fused ``per_token`` cores: given ``hidden`` in f32 holding
values of lm_head's dtype, dhidden comes back in f32, unrounded (the vocab-parallel
wrapper sums the shards' partials in f32 and rounds once). A core that rounds its
partial to bf16 gives the sharded result the error of a bf16 reduction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.impls import get
from grpo_jax.spec import Knobs, Problem
from helpers import make_inputs
from test_baseline import KNOB_SETS
from test_sharded import FUSED


@pytest.mark.parametrize("impl_id,options", FUSED)
def test_per_token_dhidden_is_f32_and_unrounded(impl_id, options):
    problem = Problem("fused", 2, 8, 300, 64, "bf16")
    inputs = make_inputs(problem, 3)
    knobs = Knobs.from_json(KNOB_SETS["grpo_token_beta"])
    impl = get(impl_id)
    core = impl.per_token(problem, knobs, impl.resolve_options(options))
    h = jnp.asarray(inputs["hidden"]).astype(jnp.float32)  # bf16 values, held in f32
    w = jnp.asarray(inputs["lm_head"])
    ids = jnp.asarray(inputs["chosen_ids"])
    g = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    _, vjp = jax.vjp(lambda x: core(x, w, ids), h)
    (dh,) = vjp((jnp.asarray(g), jnp.zeros((2, 8), jnp.float32)))
    assert dh.dtype == jnp.float32
    dh = np.asarray(dh)
    # f64 reference: d logp_y / d z = (onehot − p) / τ (τ = 1), then through z = h @ w.
    h64, w64 = np.asarray(h, np.float64), np.asarray(w.astype(jnp.float32), np.float64)
    z = h64 @ w64
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dz = -p * g[..., None]
    np.put_along_axis(dz, np.asarray(ids)[..., None].astype(np.int64),
                      np.take_along_axis(dz, np.asarray(ids)[..., None].astype(np.int64), -1)
                      + g[..., None], -1)
    want = dz @ w64.T
    rounded = np.asarray(jnp.asarray(dh).astype(jnp.bfloat16).astype(jnp.float32))
    err = np.linalg.norm(dh - want) / np.linalg.norm(want)
    err_bf16 = np.linalg.norm(rounded - want) / np.linalg.norm(want)
    assert not np.array_equal(dh, rounded), "dhidden was rounded to bf16"
    # A kernel may feed the MXU a bf16 coefficient (error of the order of one bf16
    # rounding, spread over the sum), but never be worse than rounding its result.
    assert err < err_bf16, (err, err_bf16)
