"""pallas_logits_2pass (interpret mode on CPU) against the f64 oracle, a stale-weight
variant that must fail, and its derived cost on TPU: one read and one write of the logits."""

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import kernel_cost
from grpo_jax.impls import get, grpo_math, pallas_logits_2pass
from grpo_jax.spec import Knobs, Problem, input_specs
from helpers import compare, make_inputs, run_impl
from oracle import oracle
from test_baseline import KNOB_SETS

TOKEN_LEVEL = sorted(n for n, k in KNOB_SETS.items() if k.get("importance_sampling_level", "token") == "token")


def _check(problem, knobs_json, options, seed=0, inputs=None):
    inputs = inputs or make_inputs(problem, seed)
    knobs = Knobs.from_json(knobs_json)
    got = run_impl("pallas_logits_2pass", problem, knobs, inputs, options)
    want = oracle(inputs, knobs.to_json(), problem.level)
    return compare(got, want, inputs["mask"], problem.dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", TOKEN_LEVEL)
def test_matches_oracle(name, dtype):
    """B=4 (row 2 all masked), V=2049 unaligned, every token-level knob set."""
    assert _check(Problem("logits", 4, 8, 2049, None, dtype), KNOB_SETS[name], {"block_rows": 8}) == []


def test_partial_row_block_and_temperature():
    knobs = dict(temperature=0.7, epsilon_high=0.28, beta=0.04, delta=1.6)
    assert _check(Problem("logits", 3, 5, 4097, None, "bf16"), knobs, {"block_rows": 8}, seed=3) == []


def test_sequence_level_is_refused():
    impl = get("pallas_logits_2pass")
    reason = impl.support_reason(Problem("logits", 2, 4, 300, None, "f32"),
                                 Knobs(importance_sampling_level="sequence"), impl.resolve_options({}))
    assert "importance_sampling_level 'sequence'" in reason


def test_a_stale_aggregation_weight_fails():
    """The deliberately wrong variant: bnpo's weights in the in-kernel gradient of a grpo
    loss (a stale normaliser) must fail the oracle on dlogits, and only there."""
    import jax
    from grpo_jax.spec import output_specs
    problem = Problem("logits", 4, 8, 2049, None, "f32")
    inputs = make_inputs(problem, 0)
    knobs = Knobs(beta=0.04)
    impl = get("pallas_logits_2pass")
    opts = {**impl.default_options, "_unsafe_weight_loss_type": "bnpo"}
    outs = jax.jit(impl.build(problem, knobs, opts))(*inputs.values())
    got = {s.name: np.asarray(o) for s, o in zip(output_specs(problem), outs)}
    problems = compare(got, oracle(inputs, knobs.to_json(), "logits"), inputs["mask"], "f32")
    assert problems and all(p.startswith("dlogits") for p in problems), problems


@pytest.mark.parametrize("shape,dtype", [((1, 8192, 151936), "bf16"), ((1, 8192, 151936), "f32"),
                                         ((1, 4096, 151936), "bf16")])
def test_tpu_kernel_reads_and_writes_the_logits_once(shape, dtype):
    impl = get("pallas_logits_2pass")
    problem = Problem("logits", *shape, None, dtype, "tpu")
    opts = impl.resolve_options({"block_rows": 8, "vmem_limit_bytes": 64 * 2**20})
    k = Knobs(beta=0.04)
    assert impl.support_reason(problem, k, opts) is None
    (kc,) = kernel_cost.kernel_costs(impl.build(problem, k, opts), [s.struct() for s in input_specs(problem)])
    logits = shape[0] * shape[1] * shape[2] * jnp.dtype({"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype]).itemsize
    d, dec = kc["derived"], kc["declared"]
    assert d["hbm_bytes"] / logits < 2.05, d
    assert abs(dec["bytes_accessed"] - d["hbm_bytes"]) / d["hbm_bytes"] < 0.02
    assert abs(dec["flops"] - d["matmul_flops"] - d["other_flops"]) / (d["matmul_flops"] + d["other_flops"]) < 0.10, (dec, d)
    assert abs(dec["transcendentals"] - d["transcendentals"]) / d["transcendentals"] < 0.02, (dec, d)


def test_vocab_major_shapes_are_refused_on_tpu():
    impl = get("pallas_logits_2pass")
    reason = impl.support_reason(Problem("logits", 4, 1024, 151643, None, "bf16", "tpu"), Knobs(),
                                 impl.resolve_options({}))
    assert "vocab-major" in reason
