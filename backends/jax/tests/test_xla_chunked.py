"""xla_chunked (fused level, plain XLA) against the f64 oracle: every knob set, both
logits dtypes, chunk sizes that do and do not divide N and V (remainder chunks), and
chunk-size invariance."""

import numpy as np
import pytest

from grpo_jax.spec import Knobs, Problem
from helpers import compare, make_inputs, run_impl
from oracle import oracle
from test_baseline import KNOB_SETS

# N = 3*7 = 21 tokens, V = 1000, H = 40: chunks of 8 tokens x 256 vocab leave remainders.
PROBLEM = dict(b=3, t=7, v=1000, h=40)
SMALL = dict(chunk_tokens=8, chunk_vocab=256)


def _run(dtype, knobs_json, options, seed=1, impl="xla_chunked", **shape):
    """(problem, inputs, knobs, outputs) of ``impl`` on PROBLEM (or ``shape``)."""
    shape = {**PROBLEM, **shape}
    problem = Problem("fused", shape["b"], shape["t"], shape["v"], shape["h"], dtype)
    inputs = make_inputs(problem, seed)
    knobs = Knobs.from_json(knobs_json)
    return problem, inputs, knobs, run_impl(impl, problem, knobs, inputs, options)


@pytest.mark.parametrize("impl", ["xla_chunked", "xla_saved_logits"])
@pytest.mark.parametrize("logits_dtype", ["f32", "input"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(KNOB_SETS))
def test_matches_oracle(name, dtype, logits_dtype, impl):
    """Both implementations of this module (xla_saved_logits: test_xla_saved_logits.py)."""
    knobs = dict(KNOB_SETS[name], logits_dtype=logits_dtype)
    problem, inputs, knobs_, got = _run(dtype, knobs, SMALL, impl=impl)
    want = oracle(inputs, knobs_.to_json(), "fused")
    assert compare(got, want, inputs["mask"], dtype) == []


@pytest.mark.parametrize("options", [
    dict(chunk_tokens=1, chunk_vocab=1000),       # one token at a time, whole vocab
    dict(chunk_tokens=21, chunk_vocab=999),       # one token chunk, remainder of 1 column
    dict(chunk_tokens=5, chunk_vocab=128),        # 4 chunks + remainder 1 in both
    dict(chunk_tokens=4096, chunk_vocab=1 << 20),  # clamped to the array
])
def test_chunk_size_invariance(options):
    knobs = KNOB_SETS["grpo_token_beta"]
    *_, ref = _run("f32", knobs, SMALL)
    *_, got = _run("f32", knobs, options)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=2e-6, err_msg=name)


def test_unknown_and_bad_options_are_errors():
    from grpo_jax.impls import get
    from grpo_jax.spec import RequestError
    impl = get("xla_chunked")
    with pytest.raises(RequestError, match="chunk_tokens"):
        impl.check_options({"chunk_tokens": 0})
    with pytest.raises(RequestError, match="unknown impl_options"):
        impl.check_options({"block_rows": 8})
    with pytest.raises(RequestError, match="dz_precision"):
        impl.check_options({"dz_precision": "bf16"})


@pytest.mark.parametrize("options", [
    dict(SMALL, dz_precision="x3_dlm_head"),
    dict(SMALL, dz_precision="x3", lm_head_layout="vh"),
])
def test_dz_in_16_bit_terms_matches_the_oracle(options):
    """dz_precision (the memory corner with the trajectory kept): the recomputed tiles'
    dz enters the backward products as 16-bit terms (bf16 only: f32 inputs take one f32
    matmul whatever the option)."""
    knobs = dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input")
    problem, inputs, knobs_, got = _run("bf16", knobs, options)
    want = oracle(inputs, knobs_.to_json(), "fused")
    assert compare(got, want, inputs["mask"], "bf16") == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_vocab_major_lm_head_matches_oracle(dtype):
    """lm_head_layout=vh (what XLA:TPU picks for e.g. bf16 [4096, 151643]) on CPU."""
    knobs = dict(KNOB_SETS["grpo_sequence"], logits_dtype="input")
    problem, inputs, knobs_, got = _run(dtype, knobs, dict(SMALL, lm_head_layout="vh"))
    want = oracle(inputs, knobs_.to_json(), "fused")
    assert compare(got, want, inputs["mask"], dtype) == []


def _fetch_kernels(impl_id, options, platform, **shape):
    """How many lm_head_fetch kernels the built function's jaxpr calls (recursively)."""
    import jax

    from grpo_jax.impls import get
    shape = {**PROBLEM, **shape}
    problem = Problem("fused", shape["b"], shape["t"], shape["v"], shape["h"], "bf16",
                      platform=platform)
    impl = get(impl_id)
    fn = impl.build(problem, Knobs.from_json(KNOB_SETS["grpo_token_beta"]),
                    impl.check_options(options))
    inputs = make_inputs(problem, 1)
    found = []

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "pallas_call":
                found.append(str(eqn.params.get("name") or ""))
                continue
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (list, tuple)) else [p]):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None:
                        walk(getattr(inner, "jaxpr", inner))
    walk(jax.make_jaxpr(fn)(*inputs.values()).jaxpr)
    assert all("lm_head_fetch" in name for name in found), found
    return len(found)


@pytest.mark.parametrize("impl", ["xla_chunked", "xla_saved_logits"])
@pytest.mark.parametrize("options", [
    dict(chunk_tokens=21, chunk_vocab=256),    # 3 fetched chunks and a remainder of 232
    dict(chunk_tokens=8, chunk_vocab=500),     # 2 whole chunks, 3 token chunks
    dict(chunk_tokens=21, chunk_vocab=128, lm_head_layout="vh"),
])
def test_the_pallas_fetched_lm_head_chunks_are_the_sliced_ones(impl, options):
    """lm_head_fetch "pallas" (the DMA kernel, in Pallas' interpreter off TPU) feeds the
    loops the very chunks a dynamic slice does: the same outputs, bit for bit."""
    knobs = dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input")
    assert _fetch_kernels(impl, dict(options, lm_head_fetch="pallas"), "cpu") > 0
    *_, ref = _run("bf16", knobs, dict(options, lm_head_fetch="slice"), impl=impl)
    *_, got = _run("bf16", knobs, dict(options, lm_head_fetch="pallas"), impl=impl)
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def test_the_lm_head_is_fetched_by_pallas_only_when_asked_and_only_scanned_chunks():
    """null is "slice" on every platform; "pallas" fetches the scanned chunks (xla_chunked's
    token-outer forward once per token chunk), in either LM-head orientation; the static
    chunks (a lone whole chunk, the remainder) are sliced either way."""
    one = dict(chunk_tokens=21, chunk_vocab=256)
    pallas = dict(one, lm_head_fetch="pallas")
    for impl in ("xla_chunked", "xla_saved_logits"):
        for platform in ("tpu", "cpu", "cuda"):
            assert _fetch_kernels(impl, one, platform) == 0
            assert _fetch_kernels(impl, pallas, platform) > 0
        assert _fetch_kernels(impl, dict(pallas, lm_head_layout="vh"), "tpu") > 0
        # One vocab chunk and a remainder: both at static offsets, nothing fetched.
        assert _fetch_kernels(impl, dict(pallas, chunk_vocab=999), "tpu") == 0


def test_a_bad_lm_head_fetch_is_an_error_and_an_unaligned_one_unsupported_on_tpu():
    from grpo_jax.impls import get
    from grpo_jax.spec import RequestError
    knobs = Knobs.from_json(KNOB_SETS["grpo_token_beta"])
    for impl in ("xla_chunked", "xla_saved_logits"):
        with pytest.raises(RequestError, match="lm_head_fetch"):
            get(impl).check_options({"lm_head_fetch": "dma"})
        options = get(impl).check_options({"lm_head_fetch": "pallas", "chunk_vocab": 100})
        on = {p: Problem("fused", 3, 7, 1000, 40, "bf16", platform=p) for p in ("tpu", "cpu")}
        assert "multiple of 128" in get(impl).support_reason(on["tpu"], knobs, options)
        assert get(impl).support_reason(on["cpu"], knobs, options) is None
        vh = dict(options, lm_head_layout="vh", chunk_vocab=120)
        assert "multiple of 16" in get(impl).support_reason(on["tpu"], knobs, vh)
        assert get(impl).support_reason(on["tpu"], knobs, dict(vh, chunk_vocab=128)) is None
        # The boundary: exactly two whole chunks is a loop with a traced offset (refused
        # unaligned on tpu); one whole chunk and a remainder is two static slices.
        two = Problem("fused", 3, 7, 200, 40, "bf16", platform="tpu")
        assert "multiple of 128" in get(impl).support_reason(two, knobs, options)
        assert _fetch_kernels(impl, options, "cpu", v=200) > 0
        one_and_rest = Problem("fused", 3, 7, 199, 40, "bf16", platform="tpu")
        assert get(impl).support_reason(one_and_rest, knobs, options) is None
        assert _fetch_kernels(impl, options, "cpu", v=199) == 0
