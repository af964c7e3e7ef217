"""precision.py: every matmul with an f32 operand is recorded while a module is lowered,
and a cpu export computes DEFAULT / HIGH f32 matmuls as an accelerator would."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from grpo_jax import precision
from grpo_jax.export import handle_request

HI = jax.lax.Precision.HIGHEST


def _exported(fn, *args, platform="cpu", emulates="tpu"):
    with precision.watch(platform, emulates) as dots:
        exp = jax.export.export(jax.jit(fn), platforms=[platform])(
            *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args])
    return exp, precision.summarize(dots)


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    # 23 significant bits each: bf16 rounding changes them, f32 holds them exactly.
    a = (rng.integers(1, 2**23, (4, 16)) * 2.0**-23).astype(np.float32)
    b = (rng.integers(1, 2**23, (16, 8)) * 2.0**-23).astype(np.float32)
    return a, b


def _round(x, mantissa):
    return np.asarray(jax.lax.reduce_precision(jnp.asarray(x), exponent_bits=8,
                                               mantissa_bits=mantissa))


@pytest.mark.parametrize("prec,mantissa", [(None, 7), (jax.lax.Precision.HIGH, 10)])
def test_a_reduced_f32_matmul_is_computed_as_the_accelerator_does(prec, mantissa):
    a, b = _operands()
    exp, dots = _exported(lambda x, y: jnp.dot(x, y, precision=prec), a, b)
    got = np.asarray(exp.call(a, b))
    want = _round(a, mantissa).astype(np.float64) @ _round(b, mantissa).astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    # The emulated product is the rounded operands' (to f32 accumulation), far from f32's.
    assert np.max(np.abs(got - want)) < 1e-5 * np.max(np.abs(want))
    assert np.max(np.abs(got - exact)) > 10 * np.max(np.abs(got - want))
    assert [(d["lhs"], d["rhs"], d["precision"], d["emulated"]) for d in dots] == [
        ("f32[4,16]", "f32[16,8]", "HIGH" if prec else "DEFAULT",
         "tf32" if prec else "bf16")]
    assert re.search(r"<lambda> \(test_precision\.py:\d+\)$", dots[0]["where"]), dots[0]


def test_highest_and_bf16_matmuls_are_not_emulated():
    a, b = _operands()
    exp, dots = _exported(lambda x, y: jnp.dot(x, y, precision=HI), a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(np.asarray(exp.call(a, b)) - exact)) < 1e-6 * np.max(exact)
    assert dots[0]["precision"] == "HIGHEST" and dots[0]["emulated"] is None
    b16 = b.astype(jnp.bfloat16)
    exp, mixed = _exported(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32,
                                                precision=HI), a, b16)
    assert mixed[0]["mixed"] and mixed[0]["emulated"] is None
    want = a.astype(np.float64) @ np.asarray(b16, np.float64)
    assert np.max(np.abs(np.asarray(exp.call(a, b16)) - want)) < 1e-6 * np.max(want)
    _, none = _exported(lambda x, y: jnp.dot(x, y), a.astype(jnp.bfloat16), b16)
    assert none == []


@pytest.mark.parametrize("f32_side", ["lhs", "rhs"])
@pytest.mark.parametrize("prec,mantissa", [(None, 7), (jax.lax.Precision.HIGH, 10)])
def test_a_mixed_matmul_has_its_f32_operand_rounded_as_the_accelerator_does(
        prec, mantissa, f32_side):
    """f32 × bf16 at DEFAULT (jax's VJP of a bf16 einsum: the f32 cotangent against the
    bf16 operand) is one bf16 pass on a TPU, TF32 on a GPU: the f32 operand is rounded,
    whichever side it is on; the bf16 one is exact already."""
    a, b = _operands()
    if f32_side == "rhs":  # bf16 × f32: the same product, operands swapped
        a, b = b.T.copy(), a.T.copy()
        b16, f = a.astype(jnp.bfloat16), b
        args = (b16, f)
        want = np.asarray(b16, np.float64) @ _round(f, mantissa).astype(np.float64)
        exact = np.asarray(b16, np.float64) @ f.astype(np.float64)
    else:
        b16 = b.astype(jnp.bfloat16)
        args = (a, b16)
        want = _round(a, mantissa).astype(np.float64) @ np.asarray(b16, np.float64)
        exact = a.astype(np.float64) @ np.asarray(b16, np.float64)
    exp, dots = _exported(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32,
                                               precision=prec), *args)
    got = np.asarray(exp.call(*args))
    assert np.max(np.abs(got - want)) < 1e-5 * np.max(np.abs(want))
    assert np.max(np.abs(got - exact)) > 10 * np.max(np.abs(got - want))
    assert [(d["mixed"], d["emulated"]) for d in dots] == [
        (True, "tf32" if prec else "bf16")]


def test_a_gpu_emulation_rounds_default_to_tf32():
    a, b = _operands()
    exp, dots = _exported(lambda x, y: jnp.dot(x, y), a, b, emulates="gpu")
    want = _round(a, 10).astype(np.float64) @ _round(b, 10).astype(np.float64)
    assert np.max(np.abs(np.asarray(exp.call(a, b)) - want)) < 1e-5 * np.max(np.abs(want))
    assert dots[0]["emulated"] == "tf32"


@pytest.mark.parametrize("emulates,kept", [("tpu", True), ("gpu", False)])
def test_a_16_bit_round_trip_is_kept_as_the_emulated_accelerator_keeps_it(emulates, kept):
    """A kernel that returns bf16 per-token values through a round trip: XLA:TPU keeps the
    rounding, XLA:GPU removes it (excess precision). A cpu export standing for a TPU must
    not be kinder than the TPU."""
    x = np.asarray([1.0 + 2.0 ** -10, 3.0 + 2.0 ** -12], np.float32)
    exp, _ = _exported(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32) * 1.0, x,
                       emulates=emulates)
    got = np.asarray(exp.call(x))
    assert np.array_equal(got, np.asarray(x.astype(jnp.bfloat16), np.float32)) == kept
    assert np.array_equal(got, x) == (not kept)
    assert (precision.round_trips() != []) == (not kept)


def test_an_unknown_emulation_is_refused():
    with pytest.raises(ValueError, match="emulates must be one of"):
        with precision.watch("cpu", "npu"):
            pass


def test_tpu_exports_record_without_emulating_and_the_rules_are_restored():
    a, b = _operands()
    _, dots = _exported(lambda x, y: jnp.dot(x, y), a, b, platform="tpu")
    assert dots[0]["precision"] == "DEFAULT" and dots[0]["emulated"] is None
    # Outside watch(), a cpu export is plain XLA:CPU again (f32).
    exp = jax.export.export(jax.jit(lambda x, y: jnp.dot(x, y)), platforms=["cpu"])(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(np.asarray(exp.call(a, b)) - exact)) < 1e-6 * np.max(exact)


def test_a_pallas_kernels_dots_are_named_and_not_emulated():
    a, b = _operands()

    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    def fn(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4, 8), jnp.float32),
                              interpret=True, name="tiny_mm")(x, y)
    exp, dots = _exported(fn, a, b)
    assert [(d["kernel"], d["emulated"]) for d in dots] == [("tiny_mm", None)]
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(np.asarray(exp.call(a, b)) - exact)) < 1e-6 * np.max(exact)


def _fused(impl, dtype, options=None, platform="cpu", **more):
    return handle_request({"impl": impl, "level": "fused", "b": 2, "t": 8, "v": 2049, "h": 64,
                           "dtype": dtype, "impl_options": options or {},
                           "platform": platform, "knobs": {"beta": 0.04}, **more}, _fused.cache)


def test_a_cpu_export_says_which_accelerator_it_emulates(tmp_path):
    """The request names it (default tpu), the manifest says it, and the cache key holds
    it: a gpu export is another module."""
    _fused.cache = tmp_path
    opts = {"chunk_tokens": 8, "chunk_vocab": 512, "matmul_precision": "default"}
    tpu = _fused("xla_chunked", "f32", opts)
    gpu = _fused("xla_chunked", "f32", opts, emulates="gpu")
    assert tpu["manifest"]["emulates"] == "tpu" and gpu["manifest"]["emulates"] == "gpu"
    assert tpu["key"] != gpu["key"]
    assert {d["emulated"] for d in gpu["manifest"]["f32_dots"]} == {"tf32"}
    bad = _fused("xla_chunked", "f32", opts, emulates="npu")
    assert bad["status"] == "error" and "emulates must be one of" in bad["message"], bad
    on_tpu = _fused("xla_chunked", "f32", opts, platform="tpu", emulates="gpu")
    assert on_tpu["status"] == "error" and "cpu platform only" in on_tpu["message"], on_tpu


def test_manifests_record_jax_baselines_highest_f32_matmuls_and_xla_chunkeds_declaration(
        tmp_path):
    _fused.cache = tmp_path
    base = _fused("jax_baseline", "f32")["manifest"]
    assert len(base["f32_dots"]) == 3 and base["declared_precision"] is None
    assert {d["precision"] for d in base["f32_dots"]} == {"HIGHEST"}
    assert all(d["where"].startswith("fused_logits (baseline.py:") for d in base["f32_dots"])
    chunked = _fused("xla_chunked", "f32", {"chunk_tokens": 8, "chunk_vocab": 512,
                                            "matmul_precision": "default"})["manifest"]
    assert chunked["declared_precision"] == "matmul_precision: default"
    assert {d["emulated"] for d in chunked["f32_dots"]} == {"bf16"}
    assert _fused("xla_chunked", "f32")["manifest"]["declared_precision"] is None


def test_a_declaration_that_names_nothing_is_an_error(tmp_path, monkeypatch):
    """reduced_precision returning "" or False would excuse every DEFAULT f32 matmul while
    declaring nothing: the request is an error naming the implementation."""
    import dataclasses
    from grpo_jax.impls import registry
    base = registry.IMPLEMENTATIONS["xla_chunked"]
    for bad in ("", "  ", False, 0):
        monkeypatch.setitem(registry.IMPLEMENTATIONS, "xla_chunked",
                            dataclasses.replace(base, reduced_precision=lambda o, b=bad: b))
        _fused.cache = tmp_path
        r = _fused("xla_chunked", "f32")
        assert r["status"] == "error", r
        assert "reduced_precision must return None or a non-empty string" in r["message"], r


@pytest.mark.parametrize("impl,options,dtype,cls", [
    ("xla_chunked", {"dz_precision": "x1"}, "bf16", "bf16"),
    ("xla_chunked", {"dz_precision": "x3_dlm_head"}, "bf16", "bf16x3"),
    ("xla_chunked", {"dz_precision": "x3"}, "bf16", "f32"),
    ("xla_chunked", {"dz_precision": "x1"}, "f32", None),
    ("xla_saved_logits", {"dz_precision": "x1"}, "f16", "bf16"),
    ("pallas_fused", {"bwd_dz_dtype": "input"}, "bf16", "bf16"),
    ("pallas_fused", {"bwd_dz_dtype": "x3_dlm_head"}, "bf16", "bf16x3"),
    ("pallas_fused", {"bwd_dz_dtype": "f32"}, "bf16", None),
    ("jax_baseline", {"dz_precision": "default"}, "bf16", None),
    ("jax_baseline", {"dz_precision": "x3_dlm_head"}, "bf16", "bf16x3"),
])
def test_options_that_round_dz_name_their_class(impl, options, dtype, cls):
    """dz rounded to bf16 terms before bf16 x bf16 products is no f32 dot: the options
    name the class (docs/spec.md, "Precision classes"), and the manifest carries it."""
    from grpo_jax.impls import registry
    i = registry.IMPLEMENTATIONS[impl]
    assert i.declared_class({**i.default_options, **options}, dtype) == cls


def test_the_manifest_carries_the_option_class_and_a_wrong_one_is_an_error(
        tmp_path, monkeypatch):
    import dataclasses
    from grpo_jax.impls import registry
    _fused.cache = tmp_path
    opts = {"chunk_tokens": 8, "chunk_vocab": 512, "dz_precision": "x1"}
    assert _fused("xla_chunked", "bf16", opts)["manifest"]["option_class"] == "bf16"
    assert _fused("xla_chunked", "f32", opts)["manifest"]["option_class"] is None
    base = registry.IMPLEMENTATIONS["xla_chunked"]
    monkeypatch.setitem(registry.IMPLEMENTATIONS, "xla_chunked",
                        dataclasses.replace(base, option_class=lambda o, d: "bf8"))
    r = _fused("xla_chunked", "bf16", {**opts, "chunk_tokens": 16})
    assert r["status"] == "error" and "not a precision class" in r["message"], r
