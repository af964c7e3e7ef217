"""The derived cost of Pallas TPU kernels (``grpo_jax.kernel_cost``): a toy kernel whose
copies, MXU work, branches and loops are counted by hand; the shipped kernels' declared
``CostEstimate`` against the derivation; the seeds' fused shape against a hand formula."""

import math

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grpo_jax import kernel_cost
from grpo_jax.impls import get
from grpo_jax.spec import Knobs, Problem, input_specs

f32 = jnp.float32


def _toy(a, b):
    def kernel(a_ref, b_ref, o_ref, acc):
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _init():
            acc[...] = jnp.exp(a_ref[...])                       # 1024 exps, on 3 steps

        acc[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=f32)
        o_ref[...] = jax.lax.fori_loop(0, 3, lambda k, c: c * 2.0, acc[...])

    return pl.pallas_call(
        kernel, grid=(3, 2),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, 0)),     # changes with i only
                  pl.BlockSpec((128, 128), lambda i, j: (0, j))],  # changes every step
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((20, 128), f32),
        scratch_shapes=[pltpu.VMEM((8, 128), f32)],
        cost_estimate=pl.CostEstimate(flops=1, transcendentals=2, bytes_accessed=3),
        name="toy")(a, b)


def test_a_toy_kernel_is_counted_as_a_person_counts_it():
    (k,) = kernel_cost.kernel_costs(_toy, [jax.ShapeDtypeStruct((20, 128), f32),
                                           jax.ShapeDtypeStruct((128, 256), f32)])
    assert (k["name"], k["grid"], k["steps"]) == ("toy", [3, 2], 6)
    blocks = {b["operand"]: b for b in k["blocks"]}
    # a: fetched when i changes (3 times); its last block is 4 of 8 rows (clipped).
    assert blocks["in0"]["copies"] == 3 and blocks["in0"]["bytes"] == (8 + 8 + 4) * 128 * 4
    # b: its block index changes every step: 6 copies of 64 KiB.
    assert blocks["in1"]["copies"] == 6 and blocks["in1"]["bytes"] == 6 * 128 * 128 * 4
    # o: written back when the next step's block differs and at the end: 3 times, clipped.
    assert blocks["out0"]["copies"] == 3 and blocks["out0"]["bytes"] == 20 * 128 * 4
    d = k["derived"]
    assert d["bytes_read"] == 10240 + 393216 and d["bytes_written"] == 10240
    assert d["matmul_flops"] == 6 * 2 * 8 * 128 * 128
    assert d["matmul_pass_flops"] == 6 * d["matmul_flops"]   # f32 in Mosaic: 6 passes
    assert d["transcendentals"] == 3 * 1024                   # pl.when(j == 0): 3 steps
    assert d["other_flops"] == 6 * 1024 + 6 * 3 * 1024        # acc +=, 3 loop trips
    assert k["declared"] == {"flops": 1.0, "transcendentals": 2.0, "bytes_accessed": 3.0}
    assert k["notes"] == []
    assert k["operands"] == [{"shape": [20, 128], "dtype": "f32"},
                             {"shape": [128, 256], "dtype": "f32"}]


def test_interpret_mode_calls_are_not_tpu_kernels():
    def f(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                              out_shape=jax.ShapeDtypeStruct((8, 128), f32),
                              interpret=True)(x)
    assert kernel_cost.kernel_costs(f, [jax.ShapeDtypeStruct((8, 128), f32)]) == []


def _kernels(impl_id, problem, options, knobs):
    impl = get(impl_id)
    opts = impl.resolve_options(options)
    k = Knobs.from_json(knobs)
    assert impl.support_reason(problem, k, opts) is None
    return kernel_cost.kernel_costs(impl.build(problem, k, opts),
                                    [s.struct() for s in input_specs(problem)])


def _off(declared, derived):
    return abs(declared - derived) / derived if derived else float(declared != 0)


LOGITS = [((1, 4, 151936), {"block_rows": 128, "block_v": 2048}),
          ((2, 16, 2049), {"block_rows": 128, "block_v": 2048}),
          ((2, 16, 2049), {"block_rows": 8, "block_v": 512}),
          ((4, 1024, 151643), {"block_rows": 128, "block_v": 2048})]
FUSED = [((2, 8, 2049, 64), {"block_tokens": 256, "block_v": 512}),
         ((3, 5, 4097, 33), {"block_tokens": 8, "block_v": 128, "bwd_dz_dtype": "f32"}),
         ((3, 5, 4097, 33), {"block_tokens": 8, "block_v": 128, "bwd_dz_dtype": "x3_dlm_head"}),
         ((2, 1024, 32001, 1024), {"block_tokens": 256, "block_v": 512}),
         ((3, 5, 4097, 33), {"block_tokens": 8, "block_v": 128, "dhidden": "forward"}),
         ((2, 1024, 32001, 1024), {"block_tokens": 256, "block_v": 512, "dhidden": "forward",
                                   "bwd_dz_dtype": "x3_dlm_head"}),
         ((2, 1024, 32000, 1024), {"block_tokens": 256, "block_v": 512, "dhidden": "forward",
                                   "bwd_dz_dtype": "x3_dlm_head", "lm_head_layout": "hv",
                                   "chosen_gather": "dma"})]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape,options", LOGITS)
def test_pallas_logits_declares_what_it_does(dtype, shape, options):
    for k in _kernels("pallas_logits", Problem("logits", *shape, None, dtype, "tpu"), options,
                      {"beta": 0.04}):
        d, dec = k["derived"], k["declared"]
        assert _off(dec["flops"], d["matmul_flops"] + d["other_flops"]) < 0.02, k
        assert _off(dec["transcendentals"], d["transcendentals"]) < 0.02, k
        assert _off(dec["bytes_accessed"], d["hbm_bytes"]) < 0.02, k


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("knobs", [{"beta": 0.04},
                                   {"beta": 0.04, "logits_dtype": "input", "temperature": 0.7}])
@pytest.mark.parametrize("shape,options", FUSED)
def test_pallas_fused_declares_what_it_does(dtype, knobs, shape, options):
    for k in _kernels("pallas_fused", Problem("fused", *shape, dtype, "tpu"), options, knobs):
        d, dec = k["derived"], k["declared"]
        assert _off(dec["flops"], d["matmul_flops"] + d["other_flops"]) < 0.02, k
        assert _off(dec["transcendentals"], d["transcendentals"]) < 0.02, k
        assert _off(dec["bytes_accessed"], d["hbm_bytes"]) < 0.03, k


def test_pallas_fused_at_the_seeds_shape_streams_the_lm_head_per_token_block():
    n, h, v, bt, bv = 8192, 4096, 151936, 256, 512
    ks = {k["name"]: k["derived"] for k in _kernels(
        "pallas_fused", Problem("fused", 1, n, v, h, "bf16", "tpu"),
        {"block_tokens": bt, "block_v": bv}, {"beta": 0.04})}
    mm = 2 * n * h * v
    assert sum(d["matmul_flops"] for d in ks.values()) / mm == pytest.approx(5.0, rel=1e-3)
    tb, vt = n // bt, math.ceil(v / bv)
    # forward and dhidden read the LM head once per token block, dlm_head once; dlm_head
    # reads hidden once per vocab tile.
    lm, hid = 2 * h * v, 2 * n * h
    assert ks["grpo_fused_fwd"]["hbm_bytes"] == pytest.approx(hid + tb * lm, rel=1e-3)
    assert ks["grpo_fused_dhidden"]["hbm_bytes"] == pytest.approx(2 * hid + tb * lm, rel=1e-3)
    assert ks["grpo_fused_dlm_head"]["hbm_bytes"] == pytest.approx(vt * hid + 2 * lm, rel=1e-2)


def test_the_half_declaring_variant_declares_half_its_bytes(monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[3]
                                    / "tests" / "data" / "kernels"))
    import misdeclared
    p = Problem("logits", 2, 256, 8192, None, "f32", "tpu")
    k = Knobs.from_json({"beta": 0.04})
    opts = misdeclared.IMPLEMENTATION.resolve_options({"block_rows": 128, "block_v": 2048})
    ks = kernel_cost.kernel_costs(misdeclared.IMPLEMENTATION.build(p, k, opts),
                                  [s.struct() for s in input_specs(p)])
    fwd = next(x for x in ks if x["name"] == "grpo_logp_fwd")
    assert fwd["declared"]["bytes_accessed"] == pytest.approx(0.5 * fwd["derived"]["hbm_bytes"], rel=1e-3)


def test_pallas_fused_declares_what_it_does_with_f32_hidden_on_a_vocab_shard():
    """The vocab-sharded wrapper hands the kernels f32 hidden chunks, a bf16 shard of the LM
    head and a traced count of real columns (d8-vocab at (8, 8, 2049, 64): 257 columns a
    device). The declaration counts hidden in the dtype it is given."""
    from grpo_jax.impls import pallas_fused
    p = Problem("fused", 8, 8, 257, 64, "bf16", "tpu")
    impl = get("pallas_fused")
    core = pallas_fused.per_token(p, Knobs.from_json({"beta": 0.04}),
                                  impl.resolve_options({"block_tokens": 256, "block_v": 512}))

    def fn(hidden, w, ids, valid):
        (logp, ent), vjp = jax.vjp(lambda h_, w_: core(h_, w_, ids, valid), hidden, w)
        return vjp((jnp.ones_like(logp), jnp.zeros_like(ent)))

    ks = kernel_cost.kernel_costs(fn, [jax.ShapeDtypeStruct((8, 8, 64), f32),
                                       jax.ShapeDtypeStruct((64, 257), jnp.bfloat16),
                                       jax.ShapeDtypeStruct((8, 8), jnp.int32),
                                       jax.ShapeDtypeStruct((), jnp.int32)])
    assert sorted(k["name"] for k in ks) == ["grpo_fused_dhidden", "grpo_fused_dlm_head",
                                             "grpo_fused_fwd"]
    for k in ks:
        assert k["operands"][2] == {"shape": [64, 64], "dtype": "f32"}, k["operands"]
        d, dec = k["derived"], k["declared"]
        assert _off(dec["flops"], d["matmul_flops"] + d["other_flops"]) < 0.02, k
        assert _off(dec["bytes_accessed"], d["hbm_bytes"]) < 0.02, k
