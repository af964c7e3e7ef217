"""dz_terms.py: three bf16 terms hold an f32 exactly, and the split survives XLA:GPU's
excess precision (a convert pair f32 -> bf16 -> f32 removed), which the round-trip split it
replaced did not: on an H100 that left dz in one bf16 term and failed the Adam trajectory
(docs/gpu.md, "Excess precision"). precision.excess_precision() emulates the GPU's rewrite
on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import precision
from grpo_jax.impls import dz_terms
from grpo_jax.impls.dz_terms import product_of_terms
from grpo_jax.spec import Knobs, Problem
from helpers import make_inputs
from test_baseline import KNOB_SETS

f32 = jnp.float32


def _round_trip_split(x, dtype, terms, dot):
    """The split this module used before: each residual through a 16-bit round trip."""
    out, rest = None, x
    for k in range(terms):
        term = rest.astype(dtype)
        part = dot(term)
        out = part if out is None else out + part
        if k + 1 < terms:
            rest = rest - term.astype(f32)
    return out


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    # f32 values over 60 binades with all 24 significant bits in use.
    x = (rng.standard_normal((32, 48)) * 2.0 ** rng.integers(-40, 20, (32, 48))).astype(np.float32)
    w = rng.standard_normal((48, 16)).astype(jnp.bfloat16)
    return x, w


def _product(split, x, w, emulate):
    dot = lambda t: jax.lax.dot_general(t, w, (((1,), (0,)), ((), ())), preferred_element_type=f32)
    fn = jax.jit(lambda x: split(x, jnp.bfloat16, 3, dot))
    if emulate:
        with precision.excess_precision():
            return np.asarray(fn.lower(x).compile()(x))
    return np.asarray(fn(x))


def _rel_err(got, x, w):
    want = x.astype(np.float64) @ np.asarray(w, np.float64)
    return np.max(np.abs(got - want) / (np.abs(x.astype(np.float64)) @ np.abs(np.asarray(w, np.float64))))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_the_terms_sum_to_the_f32(dtype):
    x, _ = _operands()
    if dtype == jnp.float16:  # where three f16 terms reach f32's last bit: [1, 2^10]
        x = np.clip(np.abs(x), 1.0, 2.0 ** 10) * np.sign(x)
    terms = []
    product_of_terms(jnp.asarray(x), dtype, 3, lambda t: terms.append(t) or t.astype(f32))
    assert all(t.dtype == dtype for t in terms)
    total = sum(np.asarray(t, np.float64) for t in terms)
    # bf16: 8 + 8 + 8 significant bits, exact; f16: 11 + 11 + 11 bits, exact too.
    np.testing.assert_array_equal(total, x.astype(np.float64))


def test_f16_terms_keep_its_subnormals():
    """Below f16's normal range (2^-14) a term is cut to f16's subnormal spacing 2^-24, so
    it converts exactly and the residual carries the rest: within 2^-25 of x."""
    x = jnp.asarray([3.0e-6 + 2.0 ** -30, -1.7e-5, 6.0e-8, 2.0 ** -14 + 2.0 ** -26], f32)
    terms = []
    product_of_terms(x, jnp.float16, 3, lambda t: terms.append(t) or t.astype(f32))
    total = sum(np.asarray(t, np.float64) for t in terms)
    assert np.max(np.abs(total - np.asarray(x, np.float64))) <= 2.0 ** -25


def test_a_leading_term_is_x_cut_toward_zero():
    x = jnp.asarray([1.0 + 2.0 ** -7 + 2.0 ** -8 + 2.0 ** -20, -(1.0 + 2.0 ** -8 + 2.0 ** -9)], f32)
    term, hi = dz_terms.truncated(x, jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(hi), [1.0 + 2.0 ** -7, -1.0])
    np.testing.assert_array_equal(np.asarray(term, np.float32), np.asarray(hi))


@pytest.mark.parametrize("emulate", [False, True])
def test_the_product_keeps_f32_precision_under_excess_precision(emulate):
    x, w = _operands()
    assert _rel_err(_product(product_of_terms, x, w, emulate), x, w) < 2e-6


def test_the_round_trip_split_fails_under_excess_precision_only():
    """The emulation sees what the H100 did: the old split is exact on XLA:CPU and one bf16
    term (relative error ~2^-9) once the convert pair is removed."""
    x, w = _operands()
    assert _rel_err(_product(_round_trip_split, x, w, emulate=False), x, w) < 2e-6
    assert _rel_err(_product(_round_trip_split, x, w, emulate=True), x, w) > 5e-4


def test_excess_precision_is_scoped():
    x = jnp.asarray([1.0 + 2.0 ** -10], f32)
    fn = lambda x: x - x.astype(jnp.bfloat16).astype(f32)
    with precision.excess_precision():
        inside = jax.jit(fn).lower(x).compile()(x)
    outside = jax.jit(lambda x: fn(x) + 0.0).lower(x).compile()(x)
    assert float(inside[0]) == 0.0 and float(outside[0]) == 2.0 ** -10


@pytest.mark.parametrize("impl,options", [
    ("xla_saved_logits", dict(chunk_tokens=5, chunk_vocab=128, dz_precision="x3_dlm_head")),
    ("xla_chunked", dict(chunk_tokens=5, chunk_vocab=128, dz_precision="x3")),
])
def test_a_kernel_computes_the_same_under_excess_precision(impl, options, monkeypatch):
    """The whole backward, not just the helper: with f32 logits nothing in the kernel rounds
    through a 16-bit round trip, so the GPU's rewrite changes no bit. With the old split
    (monkeypatched in) dlm_head moves."""
    from grpo_jax.impls import get, xla_chunked
    problem = Problem("fused", 3, 7, 1000, 40, "bf16")
    knobs = Knobs.from_json(dict(KNOB_SETS["grpo_token_beta"], logits_dtype="f32"))
    inputs = list(make_inputs(problem, 1).values())

    def outputs(emulate):
        i = get(impl)
        fn = jax.jit(i.build(problem, knobs, i.check_options(options)))
        if emulate:
            with precision.excess_precision():
                return [np.asarray(o, np.float32) for o in fn.lower(*inputs).compile()(*inputs)]
        return [np.asarray(o, np.float32) for o in fn(*inputs)]

    plain, emulated = outputs(False), outputs(True)
    for a, b in zip(plain, emulated):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(xla_chunked, "product_of_terms", _round_trip_split)
    plain, emulated = outputs(False), outputs(True)
    assert not np.array_equal(plain[-1], emulated[-1])  # dlm_head


def test_an_export_lists_the_round_trips_it_removed():
    """The cpu export's manifest says where the emulation changed the module (the table
    then says so beside the verdict); a module without a round trip lists none."""
    x = jnp.ones((4, 8), f32)

    def exported(fn):
        with precision.watch("cpu", "gpu"):
            jax.export.export(jax.jit(fn), platforms=["cpu"])(jax.ShapeDtypeStruct(x.shape, x.dtype))
            return precision.round_trips()

    trips = exported(lambda x: x - x.astype(jnp.bfloat16).astype(f32))
    assert [(t["type"], t["count"]) for t in trips] == [("bf16[4,8]", 1)]
    assert "test_dz_terms.py" in trips[0]["where"]
    w = jnp.ones((8, 2), jnp.bfloat16)
    dot = lambda t: jax.lax.dot_general(t, w, (((1,), (0,)), ((), ())), preferred_element_type=f32)
    assert exported(lambda x: product_of_terms(x, jnp.bfloat16, 3, dot)) == []
    with precision.watch("tpu"):  # only the cpu export emulates
        jax.export.export(jax.jit(lambda x: x - x.astype(jnp.bfloat16).astype(f32)),
                          platforms=["tpu"])(jax.ShapeDtypeStruct(x.shape, x.dtype))
        assert precision.round_trips() == []
