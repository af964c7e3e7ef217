"""pallas_logits / pallas_logits_jaxbwd (interpret mode on CPU) against the f64 oracle,
block-size invariance, the tail-mask mutant, and TPU (Mosaic) export on this CPU machine.

Interpret mode costs about (grid steps x array size), so shapes stay small: N = B*T <= 32
rows and V <= 4097 with 2-9 vocab tiles, plus one V = 151936 case with N = 4.
"""

import dataclasses
import io
import json
import os

import jax
import numpy as np
import pytest

from grpo_jax import export
from grpo_jax.impls import get, pallas_logits, registry
from grpo_jax.spec import Knobs, Problem, normalize_request, output_specs
from helpers import compare, make_inputs, run_impl
from oracle import oracle
from test_baseline import KNOB_SETS

IMPLS = ["pallas_logits", "pallas_logits_jaxbwd"]
SMALL = dict(block_rows=8, block_v=512)  # V=2049: 5 vocab tiles, last one holds 1 column


def _check(impl, problem, knobs_json, options, seed=0):
    inputs = make_inputs(problem, seed)
    knobs = Knobs.from_json(knobs_json)
    got = run_impl(impl, problem, knobs, inputs, options)
    want = oracle(inputs, knobs.to_json(), problem.level)
    return compare(got, want, inputs["mask"], problem.dtype)


# ----------------------------------------------------------------------------- oracle

@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(KNOB_SETS))
def test_pallas_bwd_matches_oracle(name, dtype):
    """B=4 (row 2 all masked), V=2049 unaligned, every loss type / level / knob."""
    assert _check("pallas_logits", Problem("logits", 4, 8, 2049, None, dtype),
                  KNOB_SETS[name], SMALL) == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["grpo_token_beta", "drgrpo_delta_L", "grpo_sequence"])
def test_jax_bwd_matches_oracle(name, dtype):
    assert _check("pallas_logits_jaxbwd", Problem("logits", 4, 8, 2049, None, dtype),
                  KNOB_SETS[name], SMALL) == []


@pytest.mark.parametrize("impl,b,t,v,dtype,options", [
    # V=4097 (last tile 1 column), several block shapes; bwd_impl as an option too.
    ("pallas_logits", 4, 8, 4097, "f32", dict(block_rows=16, block_v=1024)),
    ("pallas_logits", 4, 8, 4097, "bf16", dict(block_rows=32, block_v=2048, bwd_impl="jax")),
    ("pallas_logits_jaxbwd", 4, 8, 4097, "bf16", dict(block_rows=8, block_v=1024)),
    # N = 15 rows: a partial last row block (rows are not padded in HBM).
    ("pallas_logits", 3, 5, 2049, "f32", dict(block_rows=8, block_v=768)),
    ("pallas_logits", 3, 5, 2049, "f16", dict(block_rows=8, block_v=1024)),
    # Default options (block_rows 128 -> clamped to N, block_v 2048 -> 2 tiles).
    ("pallas_logits", 2, 8, 2049, "bf16", {}),
    # Qwen2.5 vocab, N = 4, 5 vocab tiles.
    ("pallas_logits", 1, 4, 151936, "bf16", dict(block_v=32768)),
])
def test_shapes_and_blocks_match_oracle(impl, b, t, v, dtype, options):
    knobs = dict(temperature=0.7, epsilon_high=0.28, beta=0.04, delta=1.6)
    assert _check(impl, Problem("logits", b, t, v, None, dtype), knobs, options, seed=3) == []


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("loss_type,level", [("grpo", "token"), ("bnpo", "sequence"),
                                             ("dr_grpo", "sequence")])
def test_all_masked_gives_zero_not_nan(impl, loss_type, level):
    problem = Problem("logits", 2, 5, 33, None, "bf16")  # block_v 16: 3 tiles, tail of 1
    inputs = make_inputs(problem, 6)
    inputs["mask"] = np.zeros_like(inputs["mask"])
    got = run_impl(impl, problem, Knobs(beta=0.04, loss_type=loss_type,
                                        importance_sampling_level=level),
                   inputs, dict(block_rows=8, block_v=16))
    for name, value in got.items():
        assert np.all(np.isfinite(value.astype(np.float64))), name
    assert got["loss"] == 0.0
    assert np.all(got["dlogits"].astype(np.float32) == 0.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_go_to_unclipped_branch(impl):
    """r == 1 exactly with epsilon 0: SPEC's tie rule survives the custom_vjp."""
    problem = Problem("logits", 4, 8, 2049, None, "f32")
    inputs = make_inputs(problem, 4)
    knobs = Knobs(epsilon_low=0.0, epsilon_high=0.0)
    logp = run_impl(impl, problem, knobs, inputs, SMALL)["per_token_logp"]
    tie_inputs = dict(inputs, old_logp=logp)
    got = run_impl(impl, problem, knobs, tie_inputs, SMALL)
    assert np.all(got["per_token_logp"] == logp)
    want = oracle(dict(inputs, old_logp=oracle(inputs, knobs.to_json())["per_token_logp"]),
                  knobs.to_json())
    assert compare(got, want, inputs["mask"], "f32") == []


# ----------------------------------------------------------------------------- invariance

def test_block_size_invariance():
    """Different (block_rows, block_v) and both backwards agree within f32 rounding."""
    problem = Problem("logits", 4, 8, 4097, None, "f32")
    inputs = make_inputs(problem, 11)
    knobs = Knobs(temperature=1.3, beta=0.04, loss_type="bnpo")
    configs = [("pallas_logits", dict(block_rows=8, block_v=512)),
               ("pallas_logits", dict(block_rows=16, block_v=1280)),
               ("pallas_logits", dict(block_rows=32, block_v=4097)),  # one tile, no tail
               ("pallas_logits_jaxbwd", dict(block_rows=24, block_v=2048))]
    outs = [run_impl(impl, problem, knobs, inputs, opts) for impl, opts in configs]
    base = outs[0]
    for (impl, opts), out in zip(configs[1:], outs[1:]):
        for name in base:
            a, w = out[name].astype(np.float64), base[name].astype(np.float64)
            scale = max(1.0, float(np.max(np.abs(w)))) if name != "dlogits" else \
                float(np.max(np.abs(w)))
            assert np.max(np.abs(a - w)) <= 4e-6 * scale, (impl, opts, name)


# ----------------------------------------------------------------------------- mutant

def _run_unsafe(problem, knobs, inputs, options):
    """Build with the test-only mutant option (the exporter rejects it as unknown)."""
    impl = get("pallas_logits")
    opts = {**impl.default_options, **options, "_unsafe_no_tail_mask": True}
    outs = jax.jit(impl.build(problem, knobs, opts))(*inputs.values())
    return {s.name: np.asarray(o) for s, o in zip(output_specs(problem), outs)}


def test_mutant_without_tail_mask_fails_oracle():
    """Dropping the last-tile mask must be caught (interpret mode pads with NaN, like
    the garbage a TPU reads past the array); with V a multiple of block_v the mutant is
    harmless, so the mask is the only thing the option removes."""
    knobs = Knobs(beta=0.04)
    problem = Problem("logits", 4, 8, 2049, None, "f32")
    inputs = make_inputs(problem, 0)
    got = _run_unsafe(problem, knobs, inputs, SMALL)
    problems = compare(got, oracle(inputs, knobs.to_json()), inputs["mask"], "f32")
    assert any(p.startswith("per_token_logp") for p in problems), problems
    assert any(p.startswith("dlogits") for p in problems), problems

    aligned = Problem("logits", 4, 8, 2048, None, "f32")
    inputs = make_inputs(aligned, 0)
    got = _run_unsafe(aligned, knobs, inputs, SMALL)
    assert compare(got, oracle(inputs, knobs.to_json()), inputs["mask"], "f32") == []


# ----------------------------------------------------------------------------- export

def _request(**over):
    req = {"impl": "pallas_logits", "level": "logits", "b": 2, "t": 8, "v": 2049,
           "dtype": "bf16", "knobs": {"beta": 0.04}, "impl_options": {}, "platform": "tpu"}
    req.update(over)
    return req


def test_cpu_export_is_plain_stablehlo_and_runs(tmp_path):
    """Default interpret=null is True on cpu: no custom call; the artifact reproduces run_impl."""
    req = _request(platform="cpu", dtype="f32", b=3, t=5, impl_options=SMALL)
    built = export.build_function(normalize_request(req))
    exported = export.export_function(built.fn, built.problem)
    assert "custom_call" not in exported.mlir_module()
    inputs = make_inputs(built.problem, 2)
    outs = exported.call(*inputs.values())  # beta != 0: all six inputs are kept
    direct = run_impl("pallas_logits", built.problem, Knobs(beta=0.04), inputs, SMALL)
    for s, o in zip(output_specs(built.problem), outs):
        np.testing.assert_array_equal(np.asarray(o), direct[s.name])
    result = export.handle_request(req, tmp_path)
    assert result["status"] == "ok"
    assert result["manifest"]["request"]["impl_options"] == {
        **SMALL, "interpret": None, "bwd_impl": "pallas", "logits_layout": None,
        "vmem_limit_bytes": None}


@pytest.mark.parametrize("req,calls", [
    (_request(), 2),                                                   # B > 1, bf16
    (_request(b=3, t=5, dtype="f32", impl_options=dict(block_rows=8, block_v=1024)), 2),
    (_request(impl="pallas_logits_jaxbwd", b=4, t=8, v=4097,
              knobs={"temperature": 0.7, "delta": 1.5, "loss_type": "dr_grpo",
                     "importance_sampling_level": "sequence"}), 1),
    (_request(b=1, t=4, v=151936, impl_options=dict(block_v=32768)), 2),
    (_request(b=4, t=4096, v=151936), 2),                              # export only
])
def test_tpu_export_emits_mosaic(tmp_path, req, calls):
    result = export.handle_request(req, tmp_path)
    assert result["status"] == "ok", result
    built = export.build_function(normalize_request(req))
    exported = export.export_function(built.fn, built.problem)
    assert exported.platforms == ("tpu",)
    assert exported.mlir_module().count("stablehlo.custom_call @tpu_custom_call") == calls


def test_tpu_export_under_abstract_tpu_device(tmp_path):
    """Generation-dependent lowering rules would read the abstract device; ours need none,
    but the export also works inside such a mesh (the kernel avoids rank-1 blocks)."""
    dev = jax.sharding.AbstractDevice(device_kind="TPU v6 lite", num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=dev)
    with jax.sharding.use_abstract_mesh(mesh):
        assert export.handle_request(_request(b=4), tmp_path)["status"] == "ok"


def test_tpu_batch_with_bad_configs_never_crashes(tmp_path, monkeypatch):
    reqs = [
        _request(impl_options={"block_v": 100}),                      # unsupported (check)
        _request(impl_options={"block_rows": 4}),                     # unsupported (check)
        _request(b=8, t=1024, v=151936, dtype="f32",
                 impl_options={"block_rows": 512, "block_v": 16384}),  # VMEM budget
        _request(platform="cpu", impl_options={"interpret": False}),  # mosaic needs tpu
        _request(impl_options={"bwd_impl": "cuda"}),                  # invalid option
        _request(impl_options={"_unsafe_no_tail_mask": True}),        # unknown option
        _request(impl="pallas_logits_jaxbwd", impl_options={"bwd_impl": "pallas"}),
        _request(),                                                   # ok
    ]
    out = io.StringIO()
    export.run_batch([json.dumps(r) for r in reqs], tmp_path, out)
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["status"] for r in results] == ["unsupported"] * 4 + ["error"] * 3 + ["ok"]
    assert "block_v=100 is neither a multiple of 128" in results[0]["reason"]
    assert "block_rows=4" in results[1]["reason"]
    assert "VMEM" in results[2]["reason"]
    assert "needs platform tpu" in results[3]["reason"]
    assert "bwd_impl" in results[4]["message"]
    assert "_unsafe_no_tail_mask" in results[5]["message"]

    # Without extra_check the Mosaic lowering itself rejects the block: an error line.
    unchecked = dataclasses.replace(registry.IMPLEMENTATIONS["pallas_logits"], extra_check=None)
    monkeypatch.setitem(registry.IMPLEMENTATIONS, "pallas_logits", unchecked)
    result = export.handle_request(_request(impl_options={"block_v": 100}), tmp_path)
    assert result["status"] == "error"
    assert "divisible by 8 and 128" in result["message"], result["message"]


def test_options_declared():
    a, b = get("pallas_logits"), get("pallas_logits_jaxbwd")
    common = {"block_rows": 128, "block_v": 2048, "interpret": None, "logits_layout": None,
              "vmem_limit_bytes": None}
    assert a.default_options == {**common, "bwd_impl": "pallas"}
    assert b.default_options == common
    assert pallas_logits.vmem_estimate((128, 2048), 1, "f32", True) < \
        pallas_logits.VMEM_BUDGET_BYTES


# ----------------------------------------------------------------------------- HBM layouts

def _layout_table():
    path = os.path.join(os.path.dirname(__file__), "data", "tpu_default_layouts.txt")
    with open(path) as f:
        rows = [line.split() for line in f if line.strip() and not line.startswith("#")]
    return [(int(b), int(t), int(v), d, layout) for b, t, v, d, layout in rows]


def test_tpu_default_layout_reproduces_libtpu():
    """The predicted physical order of [B, T, V] entry arrays equals what libtpu chose
    (deviceless compiles, v5e and v6e agree; regenerate with target/hbm_probe.py)."""
    table = _layout_table()
    assert len(table) > 2000
    wrong = [(b, t, v, d, want, pallas_logits.tpu_default_layout((b, t, v), d))
             for b, t, v, d, want in table
             if pallas_logits.tpu_default_layout((b, t, v), d) != want]
    assert wrong == []
    assert {layout for *_, layout in table} >= {"btv", "tbv", "bvt", "vbt", "vtb"}


@pytest.mark.parametrize("b,t,v,dtype,layout,block,squeeze", [
    (1, 2048, 151643, "bf16", "bvt", (1, 2048, 128), (0,)),
    (4, 1024, 151643, "bf16", "vbt", (256, 4, 128), ()),
    (4, 1024, 151643, "f32", "vbt", (256, 4, 128), ()),
    (1, 2048, 151643, "f32", "vbt", (2048, 1, 128), (1,)),
    (1, 8192, 151936, "bf16", "btv", (128, 2048), ()),   # the [N, V] view (free reshape)
    (4, 4096, 151936, "f32", "btv", (128, 2048), ()),
    (5, 5, 2049, "f32", "btv", (5, 5, 2048), ()),         # T % 8 != 0: no free reshape
])
def test_tpu_plan_for_suite_shapes(b, t, v, dtype, layout, block, squeeze):
    """Default options on tpu: the logits are read in XLA's layout, blocks are legal."""
    problem = Problem("logits", b, t, v, None, dtype, "tpu")
    options = get("pallas_logits").default_options
    plan = pallas_logits.make_plan(problem, options)
    assert (plan.layout, plan.block, plan.squeeze) == (layout, block, squeeze)
    assert pallas_logits.extra_check(problem, Knobs(), options) is None


LAYOUT_OPTS = dict(block_rows=16, block_v=256)


@pytest.mark.parametrize("layout", pallas_logits.LAYOUTS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_every_layout_matches_oracle(layout, dtype):
    """Interpret mode in each physical order (partial blocks on every axis, vocab tail)."""
    knobs = dict(temperature=0.7, beta=0.04, delta=1.6, loss_type="bnpo")
    assert _check("pallas_logits", Problem("logits", 3, 10, 1025, None, dtype), knobs,
                  dict(LAYOUT_OPTS, logits_layout=layout), seed=5) == []


@pytest.mark.parametrize("impl,layout", [("pallas_logits", "vbt"), ("pallas_logits", "bvt"),
                                         ("pallas_logits_jaxbwd", "vbt"),
                                         ("pallas_logits_jaxbwd", "tvb")])
def test_squeezed_layouts_match_oracle(impl, layout):
    """B = 1: the size-1 dim is squeezed out of the kernel's view (2-D tiles)."""
    knobs = dict(beta=0.04, importance_sampling_level="sequence")
    assert _check(impl, Problem("logits", 1, 12, 1025, None, "f32"), knobs,
                  dict(LAYOUT_OPTS, logits_layout=layout), seed=7) == []


def test_layout_does_not_change_results():
    """Every physical order computes the same values (within f32 reduction-order rounding)."""
    problem = Problem("logits", 2, 9, 700, None, "f32")
    inputs = make_inputs(problem, 12)
    knobs = Knobs(beta=0.04)
    outs = {layout: run_impl("pallas_logits", problem, knobs, inputs,
                             dict(block_rows=8, block_v=128, logits_layout=layout))
            for layout in pallas_logits.LAYOUTS}
    base = outs["btv"]
    for layout, out in outs.items():
        for name in base:
            a, w = out[name].astype(np.float64), base[name].astype(np.float64)
            scale = max(1.0, float(np.max(np.abs(w)))) if name != "dlogits" else \
                float(np.max(np.abs(w)))
            assert np.max(np.abs(a - w)) <= 4e-6 * scale, (layout, name)


def test_tpu_export_reads_logits_in_physical_order(tmp_path):
    """f32 [4, 1024, 151643] lives as [V][B][T] in HBM: both kernels take that array
    (a transpose XLA turns into a bitcast), not a relayout copy of [B*T, V]."""
    req = _request(b=4, t=1024, v=151643, dtype="f32")
    built = export.build_function(normalize_request(req))
    text = export.export_function(built.fn, built.problem).mlir_module()
    assert text.count("stablehlo.custom_call @tpu_custom_call") == 2
    assert "tensor<151643x4x1024xf32>" in text
    assert "tensor<4096x151643xf32>" not in text


def test_new_options_validated_and_vmem_limit_used(tmp_path):
    big = dict(b=1, t=2048, v=151936, dtype="f32")
    blocks = {"block_rows": 256, "block_v": 8192}  # ~65 MB estimated: over the 16 MiB default
    results = [export.handle_request(_request(**big, impl_options=o), tmp_path) for o in (
        {"logits_layout": "xyz"}, {"vmem_limit_bytes": 0}, {"vmem_limit_bytes": True},
        {"vmem_limit_bytes": 2 ** 40}, blocks, {**blocks, "vmem_limit_bytes": 96 << 20})]
    assert [r["status"] for r in results] == ["error"] * 4 + ["unsupported", "ok"], results
    assert "logits_layout" in results[0]["message"]
    assert "VMEM" in results[4]["reason"]
    req = _request(**big, impl_options={**blocks, "vmem_limit_bytes": 96 << 20})
    built = export.build_function(normalize_request(req))
    text = export.export_function(built.fn, built.problem).mlir_module()
    # The limit reaches both Mosaic calls as their scoped VMEM config.
    assert text.count(f"\\22size\\22: {96 << 20}}}]") == 2


def test_f16_is_unsupported_on_tpu_but_runs_interpreted():
    # Mosaic (libtpu 0.0.42.1, v5e and v6e) cannot load f16 vectors: the tpu-aot compile
    # failed with "Invalid vector type for load"; declared unsupported, never silent.
    problem = Problem("logits", 2, 8, 2049, None, "f16", platform="tpu")
    options = get("pallas_logits").default_options
    reason = pallas_logits.extra_check(problem, Knobs(), options)
    assert reason and "f16" in reason and "Invalid vector type for load" in reason
    cpu = Problem("logits", 2, 8, 2049, None, "f16", platform="cpu")
    assert pallas_logits.extra_check(cpu, Knobs(), options) is None
