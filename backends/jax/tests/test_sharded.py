"""Multi-device variants (impls/sharded.py) on 4 and 8 CPU devices against the f64 oracle
and against the same implementation on one device; the wrong variant with per-device
normalisers fails."""

import jax
import numpy as np
import pytest

from grpo_jax.impls import get, sharded
from grpo_jax.spec import Knobs, Problem, input_specs, output_specs
from helpers import compare, make_inputs
from oracle import oracle
from test_baseline import KNOB_SETS


def _run(impl_id, problem, knobs, inputs, devices, sharding, options=None, **kw):
    impl = get(impl_id)
    opts = impl.resolve_options(options or {})
    fn = sharded.build(impl, problem, knobs, opts, devices, sharding, **kw)
    ins, outs = sharded.shardings(problem, sharding, devices)
    args = sharded.pad_inputs(problem, sharding, devices, inputs)
    out = jax.jit(fn, in_shardings=ins, out_shardings=outs)(*args.values())
    got = {s.name: np.asarray(jax.device_get(o)) for s, o in zip(output_specs(problem), out)}
    return sharded.crop_outputs(problem, got)


LOGITS = [("jax_baseline", {}), ("pallas_logits", dict(block_rows=8, block_v=256))]


@pytest.mark.parametrize("impl,options", LOGITS)
@pytest.mark.parametrize("sharding,devices,v", [("batch", 4, 2049), ("vocab", 4, 2049),
                                                ("vocab", 8, 2049), ("vocab", 4, 1000)])
@pytest.mark.parametrize("name", ["grpo_token_beta", "bnpo_tau_nobeta", "drgrpo_sequence_delta"])
def test_logits_level_sharded_matches_oracle(impl, options, sharding, devices, v, name):
    problem = Problem("logits", 8, 6, v, None, "f32")
    inputs = make_inputs(problem, 3)
    knobs = Knobs.from_json(KNOB_SETS[name])
    got = _run(impl, problem, knobs, inputs, devices, sharding, options)
    assert compare(got, oracle(inputs, knobs.to_json(), "logits"), inputs["mask"], "f32") == []


@pytest.mark.parametrize("sharding", ["batch", "vocab"])
def test_sharded_equals_one_device_within_f32_rounding(sharding):
    problem = Problem("logits", 8, 6, 2049, None, "f32")
    inputs = make_inputs(problem, 4)
    knobs = Knobs.from_json(KNOB_SETS["grpo_sequence"])
    impl = get("pallas_logits")
    opts = impl.resolve_options(dict(block_rows=8, block_v=256))
    one = jax.jit(impl.build(problem, knobs, opts))(*inputs.values())
    one = {s.name: np.asarray(o) for s, o in zip(output_specs(problem), one)}
    many = _run("pallas_logits", problem, knobs, inputs, 4, sharding, dict(block_rows=8, block_v=256))
    for name in one:
        np.testing.assert_allclose(many[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", ["grpo_token_beta", "bnpo_tau_nobeta", "drgrpo_delta_L"])
def test_forgetting_the_global_denominator_fails(name):
    problem = Problem("logits", 8, 6, 2049, None, "f32")
    inputs = make_inputs(problem, 3)
    knobs = Knobs.from_json(KNOB_SETS[name])
    got = _run("jax_baseline", problem, knobs, inputs, 4, "batch", unsafe_local_normaliser=True)
    problems = compare(got, oracle(inputs, knobs.to_json(), "logits"), inputs["mask"], "f32")
    assert any(p.startswith("loss") for p in problems), problems


def test_support_reasons():
    impl = get("jax_baseline")
    assert "not divisible" in sharded.support_reason(impl, Problem("logits", 3, 4, 300, None, "f32"), 4, "batch")
    assert sharded.support_reason(impl, Problem("logits", 3, 4, 300, None, "f32"), 4, "vocab") is None


FUSED = [("jax_baseline", {}), ("xla_chunked", dict(chunk_tokens=8, chunk_vocab=128)),
         ("pallas_fused", dict(block_tokens=8, block_v=128))]


@pytest.mark.parametrize("impl,options", FUSED)
@pytest.mark.parametrize("sharding,devices,v", [("batch", 4, 1000), ("vocab", 4, 1000),
                                                ("vocab", 4, 1001), ("vocab", 8, 1001)])
@pytest.mark.parametrize("name,logits_dtype", [("grpo_token_beta", "f32"),
                                               ("bnpo_tau_nobeta", "input")])
def test_fused_level_sharded_matches_oracle(impl, options, sharding, devices, v, name, logits_dtype):
    problem = Problem("fused", 4, 5, v, 40, "bf16")
    inputs = make_inputs(problem, 5)
    knobs = Knobs.from_json(dict(KNOB_SETS[name], logits_dtype=logits_dtype))
    got = _run(impl, problem, knobs, inputs, devices, sharding, options)
    assert compare(got, oracle(inputs, knobs.to_json(), "fused"), inputs["mask"], "bf16") == []


@pytest.mark.parametrize("sharding,devices,v,gather", [("batch", 4, 1000, "xla"),
                                                      ("vocab", 4, 1001, "xla"),
                                                      ("vocab", 4, 1001, "dma")])
def test_pallas_fused_dhidden_from_the_forward_sharded(sharding, devices, v, gather):
    """pallas_fused's dhidden "forward" (pw from the forward kernel) on both shardings:
    on a vocab shard the chosen term belongs to the shard that owns the id, and the
    shard's own lse enters pw and the coefficients (lse's cotangent); W's chosen columns
    by XLA's gather or by DMAs (chosen_gather), which read a shard's own columns only."""
    problem = Problem("fused", 4, 5, v, 40, "bf16")
    inputs = make_inputs(problem, 5)
    knobs = Knobs.from_json(dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input"))
    got = _run("pallas_fused", problem, knobs, inputs, devices, sharding,
               dict(block_tokens=8, block_v=128, dhidden="forward", chosen_gather=gather))
    assert compare(got, oracle(inputs, knobs.to_json(), "fused"), inputs["mask"], "bf16") == []


def test_padded_lm_head_columns_that_count_fail():
    """V = 1001 on 4 devices: the module takes the LM head padded with 3 zero columns. A
    core that ignores ``valid_v`` counts them in the normaliser (logit 0 each) and the
    loss misses the oracle; its padded dlm_head columns are nonzero, which crop_outputs
    refuses (the Rust worker does the same)."""
    import dataclasses
    problem = Problem("fused", 4, 5, 1001, 40, "f32")
    inputs = make_inputs(problem, 5)
    knobs = Knobs.from_json(KNOB_SETS["grpo_token_beta"])
    impl = get("jax_baseline")

    def blind(p, k, o):
        core = impl.per_token(p, k, o)
        return lambda h, w, ids, valid_v=None, with_lse=False: core(h, w, ids, with_lse=with_lse)
    wrong = dataclasses.replace(impl, per_token=blind)
    fn = sharded.build(wrong, problem, knobs, {}, 4, "vocab")
    ins, outs = sharded.shardings(problem, "vocab", 4)
    args = sharded.pad_inputs(problem, "vocab", 4, inputs)
    out = jax.jit(fn, in_shardings=ins, out_shardings=outs)(*args.values())
    got = {s.name: np.asarray(o) for s, o in zip(output_specs(problem), out)}
    with pytest.raises(AssertionError, match="dlm_head: padded columns have nonzero gradient"):
        sharded.crop_outputs(problem, got)
    got["dlm_head"] = got["dlm_head"][:, :problem.v]
    problems = compare(got, oracle(inputs, knobs.to_json(), "fused"), inputs["mask"], "f32")
    assert any(p.startswith("loss") for p in problems), problems


@pytest.mark.parametrize("impl,options", FUSED)
@pytest.mark.parametrize("devices", [4, 8])
def test_fused_vocab_backward_in_token_chunks(monkeypatch, impl, options, devices):
    """The vocab-parallel fused backward in several chunks (8, 8, then 4 of 20 tokens):
    the chunk loop, its static remainder and the per-chunk f32 psum."""
    from grpo_jax.impls import vocab_fused
    monkeypatch.setattr(vocab_fused, "CHUNK_BYTES", 4 * 40 * 8)
    assert vocab_fused.chunk_tokens(20, 40) == 8
    problem = Problem("fused", 4, 5, 1001, 40, "bf16")
    inputs = make_inputs(problem, 6)
    knobs = Knobs.from_json(dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input"))
    got = _run(impl, problem, knobs, inputs, devices, "vocab", options)
    assert compare(got, oracle(inputs, knobs.to_json(), "fused"), inputs["mask"], "bf16") == []


@pytest.mark.parametrize("sharding", ["batch", "vocab"])
def test_pallas_fused_lane_major_rows_sharded(sharding):
    """block_tokens = 128: pallas_fused keeps its per-token vectors as [k, N] rows
    (Plan.lane_rows), in the full-token core and in the vocab backward's chunk cores."""
    problem = Problem("fused", 4, 64, 1001, 40, "bf16")
    inputs = make_inputs(problem, 7)
    knobs = Knobs.from_json(dict(KNOB_SETS["grpo_token_beta"], logits_dtype="input"))
    got = _run("pallas_fused", problem, knobs, inputs, 4, sharding, dict(block_tokens=128, block_v=256))
    assert compare(got, oracle(inputs, knobs.to_json(), "fused"), inputs["mask"], "bf16") == []


@pytest.mark.parametrize("impl,options", [("jax_baseline", {}),
                                          ("pallas_fused", dict(block_tokens=8, block_v=512))])
def test_dhidden_partials_summed_in_bf16_fail_the_bf16_bound(impl, options):
    """The ci case bf16-reduction-16 in small: 16 vocab shards, H = 512, bf16. The f32 sum
    of the shards' dhidden partials (the contract) stays inside the suite's bf16 gradient
    bound with room; the wrong variant that sums them in bf16 does not (worst element
    against 8e-3 · max |dhidden|, the suite's max_rel rule)."""
    problem = Problem("fused", 2, 16, 4099, 512, "bf16")
    inputs = make_inputs(problem, 8)
    knobs = Knobs.from_json(KNOB_SETS["grpo_token_beta"])
    want = oracle(inputs, knobs.to_json(), "fused")["dhidden"]
    bound = 8e-3 * np.abs(want).max()

    def worst(**kw):
        got = _run(impl, problem, knobs, inputs, 16, "vocab", options, **kw)["dhidden"]
        return np.abs(got.astype(np.float64) - want).max() / bound

    honest, wrong = worst(), worst(unsafe_bf16_reduction=True)
    print(f"{impl}: honest {honest:.2f}x, bf16 sum {wrong:.2f}x the element bound")
    assert honest < 0.7 and wrong > 1.2, (honest, wrong)


def test_mixture_entropy_does_not_cancel():
    """A row of the nightly adversarial-8 case (fused, |z|/τ ≈ 1000, 8 vocab shards): two
    shards hold the mass, the row's entropy is 0.46 next to a logsumexp of 1056. The
    combine must not subtract numbers of the size of lse (lse − Σ w_k (lse_k − H_k) was
    3.6e-2 off here, 1.7× the suite's f32 bound of 1e-5·(|lse| + max|s|) ≈ 2.1e-2)."""
    import jax.numpy as jnp
    from grpo_jax.impls.vocab_fused import mixture_entropy
    lse_k = np.array([929.404296875, 863.3331909179688, 773.9502563476562, 696.3427124023438,
                      764.5384521484375, 865.88720703125, 1054.8870849609375,
                      1056.450439453125], np.float32)
    ent_k = np.array([0.0, 6.07e-13, 3.746e-5, 0.044044, 2.245e-9, 1.504e-9, 0.0, 0.0],
                     np.float32)
    top = lse_k.max()
    lse = np.float32(top + np.log(np.sum(np.exp(lse_k.astype(np.float64) - top))))
    got = float(mixture_entropy(jnp.asarray(lse_k)[:, None], jnp.asarray(ent_k)[:, None],
                                jnp.asarray([lse]))[0])
    l64 = np.log(np.sum(np.exp(lse_k.astype(np.float64) - top))) + top
    log_w = lse_k.astype(np.float64) - l64
    want = float(np.sum(np.exp(log_w) * (ent_k - log_w)))
    assert abs(want - 0.4608) < 1e-3
    assert abs(got - want) < 1e-3, (got, want)


def _collectives(jaxpr, out):
    """Every (primitive, operand aval) of a cross-device reduction or gather, recursively."""
    from jax.extend.core import jaxprs_in_params
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("psum", "psum2", "all_gather", "reduce_scatter",
                                  "psum_scatter", "all_to_all", "ppermute"):
            out += [(eqn.primitive.name, v.aval) for v in eqn.invars]
        for sub in jaxprs_in_params(eqn.params):
            _collectives(sub, out)
    return out


@pytest.mark.parametrize("impl,options", [("jax_baseline", {}),
                                          ("pallas_fused", dict(block_tokens=8, block_v=512))])
def test_the_dhidden_reduction_is_an_f32_sum_of_the_partials(impl, options):
    """The contract of the vocab-parallel dhidden, checked directly rather than through a
    tolerance (at 0.29 of the oracle bound a bf16 sum hides inside it): every collective
    that moves a dhidden partial ([tokens, H]) between devices carries f32, so the sum is
    the f32 sum of the partials, rounded once. The wrong variant (a bf16 sum) is refused."""
    problem = Problem("fused", 2, 16, 4099, 512, "bf16")
    knobs = Knobs.from_json(KNOB_SETS["grpo_token_beta"])
    impl_ = get(impl)
    opts = impl_.resolve_options(options)
    mod = sharded.module_problem(problem, "vocab", 16)
    args = [s.struct() for s in input_specs(mod)]

    def partial_moves(**kw):
        fn = sharded.build(impl_, problem, knobs, opts, 16, "vocab", **kw)
        found = _collectives(jax.make_jaxpr(fn)(*args).jaxpr, [])
        return [(p, a) for p, a in found if a.ndim >= 2 and a.shape[-1] == problem.h]

    honest = partial_moves()
    assert honest and all(a.dtype == np.float32 for _, a in honest), honest
    wrong = partial_moves(unsafe_bf16_reduction=True)
    assert any(a.dtype != np.float32 for _, a in wrong), wrong
