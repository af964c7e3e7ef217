"""jax_baseline, run directly in JAX on CPU, agrees with the f64 oracle; mutants do not."""

import numpy as np
import pytest

from grpo_jax.impls import grpo_math
from grpo_jax.spec import Knobs, Problem
from helpers import compare, make_inputs, run_impl
from oracle import oracle

B, T, V, H = 4, 8, 2049, 32  # row 2 of the mask is all zero; V is unaligned

KNOB_SETS = {
    "grpo_token_beta": dict(temperature=1.0, epsilon_low=0.2, epsilon_high=0.28, beta=0.04),
    "bnpo_tau_nobeta": dict(temperature=0.7, loss_type="bnpo"),
    "drgrpo_delta_L": dict(temperature=1.0, beta=0.1, delta=1.5, loss_type="dr_grpo",
                           max_completion_length=12),
    "grpo_sequence": dict(temperature=1.3, beta=0.04, importance_sampling_level="sequence"),
    "drgrpo_sequence_delta": dict(delta=1.4, loss_type="dr_grpo",
                                  importance_sampling_level="sequence"),
    "bnpo_delta_eps": dict(epsilon_low=0.1, epsilon_high=0.1, delta=1.35, loss_type="bnpo",
                           beta=0.02, temperature=0.9),
}


def _check(problem, knobs_json, seed=0, impl="jax_baseline", mutate=None):
    inputs = make_inputs(problem, seed)
    knobs = Knobs.from_json(knobs_json)
    got = run_impl(impl, problem, knobs, inputs)
    if mutate is not None:
        got = mutate(got, knobs)
    want = oracle(inputs, knobs.to_json(), problem.level)
    return compare(got, want, inputs["mask"], problem.dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(KNOB_SETS))
def test_logits_level_matches_oracle(name, dtype):
    assert _check(Problem("logits", B, T, V, None, dtype), KNOB_SETS[name]) == []


@pytest.mark.parametrize("name", ["grpo_token_beta", "grpo_sequence"])
def test_logits_level_f16(name):
    assert _check(Problem("logits", B, T, V, None, "f16"), KNOB_SETS[name]) == []


@pytest.mark.parametrize("logits_dtype", ["f32", "input"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["grpo_token_beta", "grpo_sequence", "drgrpo_delta_L"])
def test_fused_level_matches_oracle(name, dtype, logits_dtype):
    knobs = dict(KNOB_SETS[name], logits_dtype=logits_dtype)
    assert _check(Problem("fused", B, T, V, H, dtype), knobs, seed=1) == []


def test_fused_logits_dtype_input_really_rounds():
    """With bf16 and logits_dtype=input the logp differ from the f32-logits ones."""
    problem = Problem("fused", B, T, V, H, "bf16")
    inputs = make_inputs(problem, 2)
    a = run_impl("jax_baseline", problem, Knobs(logits_dtype="f32"), inputs)
    b = run_impl("jax_baseline", problem, Knobs(logits_dtype="input"), inputs)
    assert np.max(np.abs(a["per_token_logp"] - b["per_token_logp"])) > 1e-4


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_mutant_without_temperature_in_gradient_fails(dtype):
    """A variant whose gradient forgets 1/temperature must be caught."""
    def drop_temperature(out, knobs):
        out = dict(out)
        out["dlogits"] = (out["dlogits"].astype(np.float64) * knobs.temperature).astype(
            out["dlogits"].dtype)
        return out
    problems = _check(Problem("logits", B, T, V, None, dtype), KNOB_SETS["bnpo_tau_nobeta"],
                      mutate=drop_temperature)
    assert any(p.startswith("dlogits") for p in problems), problems


def test_mutant_wrong_aggregation_fails():
    """bnpo weights where grpo was asked for: loss and gradient both off."""
    problem = Problem("logits", B, T, V, None, "f32")
    inputs = make_inputs(problem, 0)
    got = run_impl("jax_baseline", problem, Knobs(loss_type="bnpo"), inputs)
    want = oracle(inputs, Knobs(loss_type="grpo").to_json())
    problems = compare(got, want, inputs["mask"], "f32")
    assert any(p.startswith("loss") for p in problems)
    assert any(p.startswith("dlogits") for p in problems)


def _tie_case(level: str):
    """old_logp == logp exactly (r == 1) with epsilon_low = epsilon_high = 0: every token is a tie."""
    problem = Problem("logits", B, T, V, None, "f32")
    inputs = make_inputs(problem, 4)
    knobs = Knobs(epsilon_low=0.0, epsilon_high=0.0, importance_sampling_level=level)
    logp_jax = run_impl("jax_baseline", problem, knobs, inputs)["per_token_logp"]
    jax_inputs = dict(inputs, old_logp=logp_jax)
    want_inputs = dict(inputs, old_logp=oracle(inputs, knobs.to_json())["per_token_logp"])
    want = oracle(want_inputs, knobs.to_json())
    return problem, knobs, jax_inputs, want


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ties_go_to_unclipped_branch(level):
    problem, knobs, jax_inputs, want = _tie_case(level)
    got = run_impl("jax_baseline", problem, knobs, jax_inputs)
    assert np.all(got["per_token_logp"] == jax_inputs["old_logp"])  # exact tie in JAX
    assert compare(got, want, jax_inputs["mask"], "f32") == []


def test_naive_minimum_mutant_fails_on_ties(monkeypatch):
    """jnp.minimum/jnp.clip split tie gradients; SPEC does not. The comparison must see it."""
    import jax.numpy as jnp

    def naive(log_r, advantages, k):
        r = jnp.exp(log_r)
        a = advantages[:, None]
        r_d = r if k.delta is None else jnp.minimum(r, k.delta)
        r_c = jnp.clip(r, 1.0 - k.epsilon_low, 1.0 + k.epsilon_high)
        return -jnp.minimum(r_d * a, r_c * a), r

    problem, knobs, jax_inputs, want = _tie_case("token")
    monkeypatch.setattr(grpo_math, "clipped_pg", naive)
    got = run_impl("jax_baseline", problem, knobs, jax_inputs)
    problems = compare(got, want, jax_inputs["mask"], "f32")
    assert any(p.startswith("dlogits") for p in problems), problems


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_all_masked_rows_give_zero_not_nan(loss_type, level):
    problem = Problem("logits", 2, 5, 33, None, "bf16")
    inputs = make_inputs(problem, 6)
    inputs["mask"] = np.zeros_like(inputs["mask"])
    got = run_impl("jax_baseline", problem, Knobs(beta=0.04, loss_type=loss_type,
                                                  importance_sampling_level=level), inputs)
    for name, value in got.items():
        assert np.all(np.isfinite(value.astype(np.float64))), name
    assert got["loss"] == 0.0
    assert np.all(got["dlogits"].astype(np.float32) == 0.0)


def test_masked_garbage_does_not_leak():
    """Changing inputs at masked positions changes neither loss nor gradient."""
    problem = Problem("logits", B, T, V, None, "f32")
    inputs = make_inputs(problem, 8)
    knobs = Knobs(beta=0.04, importance_sampling_level="sequence")
    base = run_impl("jax_baseline", problem, knobs, inputs)
    m = inputs["mask"] == 0
    other = dict(inputs, old_logp=np.where(m, 1e4, inputs["old_logp"]).astype(np.float32),
                 ref_logp=np.where(m, -1e4, inputs["ref_logp"]).astype(np.float32))
    got = run_impl("jax_baseline", problem, knobs, other)
    assert got["loss"] == base["loss"]
    np.testing.assert_array_equal(got["dlogits"], base["dlogits"])
    assert all(np.all(np.isfinite(v)) for v in got.values())


def test_beta_zero_does_not_read_ref_logp():
    problem = Problem("logits", B, T, V, None, "f32")
    inputs = make_inputs(problem, 9)
    a = run_impl("jax_baseline", problem, Knobs(beta=0.0), inputs)
    b = run_impl("jax_baseline", problem, Knobs(beta=0.0),
                 dict(inputs, ref_logp=np.full_like(inputs["ref_logp"], np.nan)))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("dz_precision", ["x3", "x3_dlm_head"])
@pytest.mark.parametrize("logits_dtype", ["f32", "input"])
@pytest.mark.parametrize("name", ["grpo_token_beta", "grpo_sequence"])
def test_fused_dz_in_three_terms_matches_oracle(name, logits_dtype, dz_precision):
    """dz_precision "x3" (the bf16x3 precision class's baseline) computes SPEC's function:
    its backward takes dz as three bf16 terms, which hold an f32 exactly."""
    knobs = dict(KNOB_SETS[name], logits_dtype=logits_dtype)
    problem = Problem("fused", B, T, V, H, "bf16")
    inputs = make_inputs(problem, 1)
    got = run_impl("jax_baseline", problem, Knobs.from_json(knobs), inputs,
                   options={"dz_precision": dz_precision})
    want = oracle(inputs, Knobs.from_json(knobs).to_json(), "fused")
    assert compare(got, want, inputs["mask"], "bf16") == []
    # On a CPU the default VJP's f32 x bf16 products are exact too: the same gradients
    # to f32 summation order.
    base = run_impl("jax_baseline", problem, Knobs.from_json(knobs), inputs)
    for out in ("dhidden", "dlm_head"):
        a, b = got[out].astype(np.float64), base[out].astype(np.float64)
        assert np.max(np.abs(a - b)) <= 2 ** -7 * np.max(np.abs(b)), out


def test_an_unknown_dz_precision_is_refused():
    from grpo_jax.spec import RequestError
    problem = Problem("fused", B, T, V, H, "bf16")
    with pytest.raises(RequestError, match="dz_precision must be one of"):
        run_impl("jax_baseline", problem, Knobs(), make_inputs(problem, 0),
                 options={"dz_precision": "x2"})
