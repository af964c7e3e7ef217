"""pallas_fused (interpret mode on CPU) against the f64 oracle: knob sets, both logits
dtypes, partial token blocks and vocab tiles (interpret mode fills the out-of-bounds part
of a block with NaN, so a missing mask shows), both LM-head orientations, both dz dtypes,
block-size invariance, and TPU (Mosaic) export on this CPU machine.

Interpret mode costs about (grid steps x array size): N = 21 tokens, H = 40, V = 1000.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.impls import get
from grpo_jax.spec import Knobs, Problem, RequestError
from helpers import compare, make_inputs, run_impl
from oracle import oracle
from test_baseline import KNOB_SETS

PROBLEM = dict(b=3, t=7, v=1000, h=40)
SMALL = dict(block_tokens=8, block_v=256)  # 3 token blocks (last: 5 rows), 4 tiles (last: 232)


def _run(dtype, knobs_json, options, seed=1, **shape):
    shape = {**PROBLEM, **shape}
    problem = Problem("fused", shape["b"], shape["t"], shape["v"], shape["h"], dtype)
    inputs = make_inputs(problem, seed)
    knobs = Knobs.from_json(knobs_json)
    return problem, inputs, knobs, run_impl("pallas_fused", problem, knobs, inputs, options)


def _check(dtype, knobs_json, options, **shape):
    problem, inputs, knobs, got = _run(dtype, knobs_json, options, **shape)
    want = oracle(inputs, knobs.to_json(), "fused")
    return compare(got, want, inputs["mask"], dtype)


@pytest.mark.parametrize("logits_dtype", ["f32", "input"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["grpo_token_beta", "bnpo_tau_nobeta", "drgrpo_delta_L",
                                  "grpo_sequence"])
def test_matches_oracle(name, dtype, logits_dtype):
    assert _check(dtype, dict(KNOB_SETS[name], logits_dtype=logits_dtype), SMALL) == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("options", [
    dict(SMALL, lm_head_layout="vh"),
    dict(SMALL, bwd_dz_dtype="f32"),
    dict(block_tokens=16, block_v=128),    # 2 token blocks, 8 tiles (last: 104)
    dict(block_tokens=21, block_v=1000),   # one block, one tile (no tail anywhere)
])
def test_layouts_dz_dtypes_and_blocks(dtype, options):
    assert _check(dtype, dict(KNOB_SETS["grpo_sequence"], logits_dtype="input"), options) == []


@pytest.mark.parametrize("layout", ["hv", "vh"])
def test_dz_in_three_terms_for_dlm_head(layout):
    """bwd_dz_dtype x3_dlm_head (bf16 only: f32 inputs take f32 dz whatever the option)."""
    options = dict(SMALL, bwd_dz_dtype="x3_dlm_head", lm_head_layout=layout)
    assert _check("bf16", dict(KNOB_SETS["grpo_sequence"], logits_dtype="input"), options) == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("layout", ["hv", "vh"])
def test_lane_major_token_vectors(dtype, layout):
    """block_tokens a multiple of 128: ids, lse, logp, entropy and the backward's
    coefficients travel as [k, N] rows (Plan.lane_rows), with a partial last token block
    (300 = 2·128 + 44) and a partial last vocab tile."""
    from grpo_jax.impls.pallas_fused import make_plan
    options = dict(block_tokens=128, block_v=256, lm_head_layout=layout)
    impl = get("pallas_fused")
    plan = make_plan(Problem("fused", 3, 100, 1000, 40, dtype), Knobs.from_json({}),
                     impl.resolve_options(options))
    assert plan.lane_rows and plan.tail_n and plan.tail_v
    knobs = dict(KNOB_SETS["bnpo_tau_nobeta"], logits_dtype="input")
    assert _check(dtype, knobs, options, t=100) == []


FWD_DH = [dict(SMALL, dhidden="forward"),
          dict(SMALL, dhidden="forward", lm_head_layout="vh"),
          dict(SMALL, dhidden="forward", bwd_dz_dtype="x3_dlm_head"),
          dict(SMALL, dhidden="forward", bwd_dz_dtype="f32"),
          dict(SMALL, dhidden="forward", oob_fill="finite"),
          dict(block_tokens=128, block_v=256, dhidden="forward"),  # lane-major rows
          dict(SMALL, dhidden="forward", chosen_gather="dma")]


@pytest.mark.parametrize("dtype,name,options",
                         [("bf16", "grpo_sequence", o) for o in FWD_DH]
                         + [("f32", "grpo_token_beta", o)
                            for o in (FWD_DH[0], FWD_DH[1], FWD_DH[5], FWD_DH[6])])
def test_dhidden_from_the_forward(name, dtype, options):
    """dhidden "forward" (the 6-pass memory corner): the forward also accumulates
    pw = sum of p_v W_v over the non-chosen columns, online, and dhidden is formed from it
    and W's chosen row; partial token blocks and vocab tiles, both layouts, every dz."""
    t = 100 if options["block_tokens"] == 128 else 7
    assert _check(dtype, dict(KNOB_SETS[name], logits_dtype="input"), options, t=t) == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("v,n", [(1000, 21), (100, 5), (2048, 40)])
def test_the_dma_gathered_columns_are_the_chosen_ones(dtype, v, n):
    """chosen_columns.gather (chosen_gather "dma"): each token's column of W, bit for bit,
    with a partial last step (N not a multiple of the tokens a step), a partial last
    128-column block (V = 1000), a head narrower than one block (V = 100), and ids at
    both ends, -1 and past V (clipped, as the caller's mask expects)."""
    from grpo_jax.impls import chosen_columns
    rng = np.random.default_rng(v + n)
    h = 40
    w = jnp.asarray(rng.standard_normal((h, v)), {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype])
    ids = rng.integers(0, v, n)
    ids[:4] = [0, v - 1, -1, v + 7]
    got = np.asarray(chosen_columns.gather(w, jnp.asarray(ids, jnp.int32), interpret=True))
    want = np.asarray(w)[:, np.clip(ids, 0, v - 1)].T
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_the_dma_gather_is_refused_where_it_cannot_run():
    from grpo_jax.impls.pallas_fused import extra_check
    impl = get("pallas_fused")
    k = Knobs.from_json({})

    def why(options, v=1024, platform="tpu"):
        return extra_check(Problem("fused", 1, 256, v, 128, "bf16", platform), k,
                           impl.resolve_options(dict(options, chosen_gather="dma")))
    assert "dhidden 'forward'" in why({})
    assert "vocab-major" in why({"dhidden": "forward", "lm_head_layout": "vh"})
    assert "multiple of 128" in why({"dhidden": "forward", "lm_head_layout": "hv"}, v=1000)
    assert why({"dhidden": "forward", "lm_head_layout": "hv"}) is None
    assert why({"dhidden": "forward"}, v=1000, platform="cpu") is None


@pytest.mark.parametrize("layout", ["hv", "vh"])
def test_a_forward_that_drops_the_last_tile_from_pw_fails(monkeypatch, layout):
    """The deliberately wrong forward of issue 38: pw without the last vocab tile (232 of
    1000 columns). lse, logp and dlm_head stay right; dhidden misses the oracle."""
    from grpo_jax.impls import pallas_fused
    make_plan = pallas_fused.make_plan
    monkeypatch.setattr(pallas_fused, "make_plan", lambda *a, **k: make_plan(
        *a, **k)._replace(unsafe_pw_drop_last_tile=True))
    options = dict(SMALL, dhidden="forward", lm_head_layout=layout)
    problems = _check("bf16", dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input"), options)
    assert problems and all(p.startswith("dhidden") for p in problems), problems


def test_block_size_invariance():
    knobs = KNOB_SETS["drgrpo_delta_L"]
    *_, ref = _run("f32", knobs, SMALL)
    for options in (dict(block_tokens=16, block_v=384), dict(SMALL, lm_head_layout="vh")):
        *_, got = _run("f32", knobs, options)
        for name in ref:
            np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=2e-6, err_msg=name)


def test_bad_options_are_errors():
    impl = get("pallas_fused")
    with pytest.raises(RequestError, match="block_tokens"):
        impl.check_options({"block_tokens": 0})
    with pytest.raises(RequestError, match="bwd_dz_dtype"):
        impl.check_options({"bwd_dz_dtype": "f64"})
    with pytest.raises(RequestError, match="dhidden must be 'kernel' or 'forward'"):
        impl.check_options({"dhidden": "backward"})
    with pytest.raises(RequestError, match="chosen_gather must be one of"):
        impl.check_options({"chosen_gather": "sparsecore"})


def test_mosaic_constraints_are_unsupported_reasons():
    impl = get("pallas_fused")
    p = Problem("fused", 2, 8, 2049, 64, "bf16", "tpu")
    k = Knobs()
    assert impl.support_reason(p, k, impl.resolve_options({"block_tokens": 8, "block_v": 512})) is None
    reason = impl.support_reason(p, k, impl.resolve_options({"block_tokens": 12, "block_v": 500}))
    assert "block_tokens=12" in reason and "block_v=500" in reason
    assert "f16" in impl.support_reason(Problem("fused", 2, 8, 2049, 64, "f16", "tpu"), k,
                                        impl.resolve_options({}))


def test_bf16_rounding_by_bits_matches_a_bf16_convert():
    import jax.numpy as jnp
    import ml_dtypes
    from grpo_jax.impls.pallas_fused import _round_to_bf16
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(100000) * 10.0 ** rng.integers(-40, 38, 100000),
                        [0.0, -0.0, 1e-45, -3e-39, 3.3e38, -3.4e38, np.inf, -np.inf,
                         1.00390625, 1.01171875]]).astype(np.float32)  # incl. ties
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = np.asarray(_round_to_bf16(jnp.asarray(x)))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["f32"])
@pytest.mark.parametrize("options", [
    dict(SMALL, oob_fill="finite"),
    dict(SMALL, oob_fill="finite", lm_head_layout="vh"),
    dict(block_tokens=128, block_v=256, oob_fill="finite"),  # lane-major rows, 1 partial block
])
def test_finite_garbage_past_the_edges(dtype, options):
    """oob_fill "finite": the out-of-bounds rows and columns of the edge blocks hold finite
    garbage (as a TPU's memory may) instead of interpret mode's NaN; the masks must keep
    them out of every output, so the result still matches the oracle."""
    assert _check(dtype, dict(KNOB_SETS["grpo_token_beta"], logits_dtype="f32"), options) == []


def test_finite_garbage_is_finite_and_deterministic():
    from grpo_jax.impls.pallas_fused import finite_garbage
    import jax.numpy as jnp
    a = np.asarray(finite_garbage((5, 7), jnp.float32, 2, 1000))
    b = np.asarray(finite_garbage((5, 7), jnp.float32, 2, 1000))
    ids = np.asarray(finite_garbage((64, 1), jnp.int32, 1, 1000))
    assert np.isfinite(a).all() and (a == b).all() and np.abs(a).max() <= 2.0
    assert len(np.unique(a)) > 20, "garbage, not a constant"
    assert ids.min() >= 0 and ids.max() < 1000 and len(np.unique(ids)) > 30


def test_finite_fill_is_refused_for_mosaic():
    impl = get("pallas_fused")
    problem = Problem("fused", 1, 8, 1024, 128, "bf16", platform="tpu")
    reason = impl.support_reason(problem, Knobs.from_json({}),
                                 impl.check_options({"oob_fill": "finite"}))
    assert reason is not None and "interpret mode" in reason
    with pytest.raises(RequestError, match="oob_fill"):
        impl.check_options({"oob_fill": "zeros"})
