"""xla_saved_logits (fused level, plain XLA, the logits saved by the forward) against the
f64 oracle: every knob set, both logits dtypes, remainder chunks, both LM-head
orientations; the backward reads the saved tiles (no recomputation: 3 logits-sized
matmuls); dz enters the backward as two 16-bit terms; a backward with another row's lse
fails."""

import jax
import numpy as np
import pytest

from grpo_jax.impls import get
from grpo_jax.spec import Knobs, Problem, RequestError
from helpers import compare, make_inputs
from oracle import oracle
from test_baseline import KNOB_SETS

from test_xla_chunked import SMALL, _run as _run_impl

# test_xla_chunked's problem: N = 21 tokens, V = 1000, H = 40; SMALL leaves remainders.


def _run(dtype, knobs_json, options, seed=1, impl="xla_saved_logits", **shape):
    return _run_impl(dtype, knobs_json, options, seed, impl, **shape)


# Every knob set x dtype x logits dtype against the oracle: test_xla_chunked.py's
# test_matches_oracle, parametrized over both implementations.


@pytest.mark.parametrize("options", [
    dict(SMALL, lm_head_layout="vh"),
    dict(chunk_tokens=21, chunk_vocab=999, dz_precision="f32"),
    dict(chunk_tokens=5, chunk_vocab=128, dz_precision="x3_dlm_head"),
    dict(chunk_tokens=5, chunk_vocab=128, dz_precision="x1"),
    dict(chunk_tokens=4096, chunk_vocab=1 << 20),  # clamped to the array
])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_layouts_chunks_and_dz_precisions_match_the_oracle(options, dtype):
    knobs = dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input")
    problem, inputs, knobs_, got = _run(dtype, knobs, options)
    want = oracle(inputs, knobs_.to_json(), "fused")
    assert compare(got, want, inputs["mask"], dtype) == []


def test_it_computes_what_xla_chunked_computes():
    """Saving the tiles changes where they come from, not their values: the same chunks
    give xla_chunked's outputs to f32 rounding (f32 inputs, where dz is not split)."""
    knobs = dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input")
    *_, ref = _run("f32", knobs, SMALL, impl="xla_chunked")
    *_, got = _run("f32", knobs, SMALL)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=2e-6, err_msg=name)


def _dots(impl_id, dtype, options, logits_dtype="input"):
    """Every dot_general of the exported function's jaxpr (outside pjit/scan, recursively):
    (lhs dtype, rhs dtype, lhs shape, rhs shape)."""
    problem = Problem("fused", 3, 7, 1000, 40, dtype)
    knobs = Knobs.from_json(dict(KNOB_SETS["grpo_token_beta"], logits_dtype=logits_dtype))
    impl = get(impl_id)
    fn = impl.build(problem, knobs, impl.check_options(options))
    inputs = make_inputs(problem, 1)
    jaxpr = jax.make_jaxpr(fn)(*inputs.values())
    out = []

    def walk(j, mult):
        for eqn in j.eqns:
            if eqn.primitive.name == "dot_general":
                a, b = (v.aval for v in eqn.invars)
                out.append((str(a.dtype), str(b.dtype), a.shape, b.shape, mult))
            n = mult * (eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1)
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (list, tuple)) else [p]):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None:
                        walk(getattr(inner, "jaxpr", inner), n)
    walk(jaxpr.jaxpr, 1)
    return out


def test_three_logits_sized_matmuls_and_no_f32_operand_with_a_16_bit_lm_head():
    """The forward's matmul once, each backward product once: as one f32 matmul, or as
    one single-pass matmul per 16-bit term of dz; xla_chunked recomputes the tiles (one
    more)."""
    def flops(dots):
        total = 0
        for _, _, a, b, m in dots:
            # [M, K] x [K, N] or contracting any one axis: 2 * M * K * N = 2 * |a| * |b| / K
            k = next(d for d in a if d in b)
            total += 2 * np.prod(a) * np.prod(b) / k * m
        return total / (2 * 21 * 40 * 1000)

    x3 = _dots("xla_saved_logits", "bf16", SMALL)
    assert all(a == b == "bfloat16" for a, b, *_ in x3), x3
    assert flops(x3) == pytest.approx(7.0)   # 1 forward + 2 products x 3 single-pass terms
    assert flops(_dots("xla_saved_logits", "bf16", dict(SMALL, dz_precision="x2"))) == \
        pytest.approx(5.0)
    f32dz = _dots("xla_saved_logits", "bf16", dict(SMALL, dz_precision="f32"))
    assert flops(f32dz) == pytest.approx(3.0)
    # The two backward products take f32 operands (HIGHEST); the forward's are bf16.
    assert flops([d for d in f32dz if d[0] == d[1] == "float32"]) == pytest.approx(2.0)
    one = _dots("xla_saved_logits", "bf16", dict(SMALL, dz_precision="x3_dlm_head"))
    assert all(a == b == "bfloat16" for a, b, *_ in one), one
    assert flops(one) == pytest.approx(5.0)  # 1 + 1 + 3
    x1 = _dots("xla_saved_logits", "bf16", dict(SMALL, dz_precision="x1"))
    assert all(a == b == "bfloat16" for a, b, *_ in x1), x1
    assert flops(x1) == pytest.approx(3.0)  # the 3 matmuls: dz rounded once
    chunked = _dots("xla_chunked", "bf16", SMALL)
    assert flops(chunked) == pytest.approx(4.0)  # + the recomputed tiles
    terms = _dots("xla_chunked", "bf16", dict(SMALL, dz_precision="x3_dlm_head"))
    assert all(a == b == "bfloat16" for a, b, *_ in terms), terms
    assert flops(terms) == pytest.approx(6.0)  # 1 + 1 recomputed + 1 + 3


def test_an_lse_from_another_row_block_fails():
    """The deliberately wrong backward: each row's lse taken one token chunk on."""
    knobs = dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input")
    problem = Problem("fused", 3, 7, 1000, 40, "bf16")
    inputs = make_inputs(problem, 1)
    knobs_ = Knobs.from_json(knobs)
    impl = get("xla_saved_logits")
    # Not an impl_option (the exporter refuses it as unknown): passed to the builder.
    fn = jax.jit(impl.build(problem, knobs_, {**impl.resolve_options(SMALL),
                                               "_unsafe_lse_shift": 8}))
    names = ["loss", "per_token_logp", "per_token_loss", "kl", "clipped", "entropy",
             "dhidden", "dlm_head"]
    got = {n: np.asarray(o) for n, o in zip(names, fn(*inputs.values()))}
    want = oracle(inputs, knobs_.to_json(), "fused")
    failures = compare(got, want, inputs["mask"], "bf16")
    assert any(f.startswith(("dhidden", "dlm_head")) for f in failures), failures
    assert not any(f.startswith(("loss", "per_token")) for f in failures), failures


def test_options_are_checked():
    impl = get("xla_saved_logits")
    with pytest.raises(RequestError, match="dz_precision"):
        impl.check_options({"dz_precision": "bf16"})
    with pytest.raises(RequestError, match="chunk_vocab"):
        impl.check_options({"chunk_vocab": 0})
    with pytest.raises(RequestError, match="unknown impl_options"):
        impl.check_options({"matmul_precision": "default"})
