"""Implementations from outside the package: ``module:attribute`` ids, the adapters for
partial kernels, the not-provided outputs in the manifest, and the protocol check."""

import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from grpo_jax import adapters, export
from grpo_jax.impls import get
from grpo_jax.impls.registry import resolve_external
from grpo_jax.protocol import MISMATCH_EXIT, PROTOCOL_VERSION
from grpo_jax.spec import Knobs, Problem, RequestError
from helpers import compare, make_inputs, run_impl
from oracle import oracle


def logp_plain(logits, chosen_ids):
    z = logits.astype(jnp.float32)
    return jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), chosen_ids[..., None], axis=-1)[..., 0]


def logp_tau_entropy(logits, chosen_ids, temperature):
    z = logits.astype(jnp.float32) / temperature
    lp = jax.nn.log_softmax(z, axis=-1)
    ent = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
    return jnp.take_along_axis(lp, chosen_ids[..., None], axis=-1)[..., 0], ent


def logp_flat(logits, chosen_ids, temperature):
    assert logits.ndim == 2 and chosen_ids.ndim == 1
    z = logits.astype(jnp.float32) / temperature
    return jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), chosen_ids[:, None], axis=-1)[:, 0]


def fused_ce(hidden, lm_head, chosen_ids, temperature):
    z = jnp.einsum("bth,hv->btv", hidden, lm_head, preferred_element_type=jnp.float32) / temperature
    return jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, chosen_ids[..., None], axis=-1)[..., 0]


def _check(impl, problem, knobs_json):
    inputs = make_inputs(problem, 1)
    knobs = Knobs.from_json(knobs_json)
    assert impl.support_reason(problem, knobs, impl.resolve_options({})) is None
    fn = jax.jit(impl.build(problem, knobs, impl.resolve_options({})))
    outs = [jax.device_get(x) for x in fn(*inputs.values())]
    from grpo_jax.spec import output_specs
    got = {s.name: o for s, o in zip(output_specs(problem), outs)}
    want = oracle(inputs, knobs.to_json(), problem.level)
    for name in impl.not_provided:
        assert (got.pop(name) == 0).all()  # a placeholder, never a guess
        want.pop(name)
    return compare(got, want, inputs["mask"], problem.dtype)


KNOBS = dict(temperature=0.7, beta=0.04, epsilon_high=0.28, importance_sampling_level="sequence")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_logits_adapter_with_temperature_and_entropy(dtype):
    impl = adapters.from_logits_fn(logp_tau_entropy, id="t", returns="logp_entropy")
    assert impl.not_provided == frozenset()
    assert _check(impl, Problem("logits", 3, 5, 1000, None, dtype), KNOBS) == []


def test_logits_adapter_flattened_and_without_entropy():
    impl = adapters.from_logits_fn(logp_flat, id="f", flatten=True)
    assert impl.not_provided == {"entropy"}
    assert _check(impl, Problem("logits", 3, 5, 1000, None, "f32"), KNOBS) == []


def test_a_function_without_temperature_leaves_tau_cases_unsupported():
    impl = adapters.from_logits_fn(logp_plain, id="p")
    p = Problem("logits", 2, 4, 300, None, "f32")
    assert "temperature" in impl.support_reason(p, Knobs.from_json(KNOBS), {})
    assert _check(impl, p, dict(KNOBS, temperature=1.0)) == []


def test_fused_adapter_cross_entropy():
    impl = adapters.from_fused_fn(fused_ce, id="ce", returns="cross_entropy")
    assert _check(impl, Problem("fused", 2, 6, 500, 32, "f32"), dict(KNOBS, loss_type="dr_grpo")) == []
    p = Problem("fused", 2, 6, 500, 32, "bf16")
    assert "logits_dtype" in impl.support_reason(p, Knobs.from_json(dict(logits_dtype="input")), {})


def test_a_wrong_shape_is_a_clear_error():
    impl = adapters.from_logits_fn(lambda z, y: z[..., 0, :1], id="bad")
    p = Problem("logits", 2, 4, 300, None, "f32")
    with pytest.raises(RequestError, match="expected \\(2, 4\\)"):
        impl.build(p, Knobs(), {})(*make_inputs(p).values())


@pytest.fixture
def ext_module(tmp_path, monkeypatch):
    (tmp_path / "my_ext.py").write_text(textwrap.dedent("""
        from grpo_jax.adapters import from_logits_fn
        import jax, jax.numpy as jnp
        def lp(logits, chosen_ids, temperature):
            z = logits.astype(jnp.float32) / temperature
            return jnp.take_along_axis(jax.nn.log_softmax(z, -1), chosen_ids[..., None], -1)[..., 0]
        IMPL = from_logits_fn(lp, id="my_ext")
        NOT_AN_IMPL = lp
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    resolve_external.cache_clear()
    yield "my_ext"
    resolve_external.cache_clear()
    sys.modules.pop("my_ext", None)


def test_module_attribute_ids_resolve_and_export_with_not_provided(ext_module, tmp_path):
    assert get(f"{ext_module}:IMPL").id == "my_ext"
    res = export.handle_request({"impl": f"{ext_module}:IMPL", "b": 2, "t": 4, "v": 300},
                                tmp_path / "cache")
    assert res["status"] == "ok", res
    assert res["manifest"]["not_provided"] == ["entropy"]
    assert res["manifest"]["protocol"] == PROTOCOL_VERSION


@pytest.mark.parametrize("spec,match", [
    ("no_such_module_xyz:IMPL", "cannot import module 'no_such_module_xyz'"),
    ("my_ext:MISSING", "has no attribute 'MISSING'"),
    ("my_ext:NOT_AN_IMPL", "not a grpo_jax Implementation"),
])
def test_bad_external_ids_are_one_line_errors(ext_module, spec, match):
    with pytest.raises(RequestError, match=match):
        get(spec)
    [answer] = export.check_config([{"name": "x", "impl": spec}])
    assert not answer["ok"] and match.split("'")[0] in answer["error"]


def test_a_protocol_mismatch_is_refused(capsys):
    assert export.main(["--protocol", str(PROTOCOL_VERSION + 1), "--list-impls"]) == MISMATCH_EXIT
    err = capsys.readouterr().err
    assert "protocol mismatch" in err and "pip install" in err and len(err.strip().splitlines()) == 1
    assert export.main(["--protocol", str(PROTOCOL_VERSION), "--list-impls"]) == 0


def test_a_case_of_another_level_is_not_applicable_rather_than_unsupported():
    impl = adapters.from_logits_fn(logp_plain, id="p")
    reason = impl.support_reason(Problem("fused", 2, 4, 300, 16, "f32"), Knobs.from_json(dict(KNOBS, temperature=1.0)), {})
    assert reason == "not applicable: level 'fused'"
    # A limitation of a level it has stays "not supported" (an ignored trial).
    assert impl.support_reason(Problem("logits", 2, 4, 300, None, "f32"), Knobs.from_json(KNOBS), {}).startswith("not supported")


@pytest.fixture
def misbehaving(tmp_path, monkeypatch):
    """Modules that fail while imported, built or traced."""
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit('bye from import')\n")
    (tmp_path / "raises_on_import.py").write_text("def f():\n    raise RuntimeError('boom')\nf()\n")
    (tmp_path / "bad_trace.py").write_text(textwrap.dedent("""
        import dataclasses, sys
        import jax.numpy as jnp
        from grpo_jax.impls import baseline

        def _wrap(post):
            def build(problem, knobs, options):
                fn = baseline.IMPLEMENTATION.build(problem, knobs, options)
                return lambda *args: post(tuple(fn(*args)))
            return dataclasses.replace(baseline.IMPLEMENTATION, id="bad", build=build)

        def _raise(outs):
            raise ValueError("cannot trace")

        def _exit(outs):
            sys.exit(3)

        RAISES = _wrap(_raise)
        EXITS = _wrap(_exit)
        WRONG = _wrap(lambda o: (o[0][None], o[1].astype(jnp.float16)) + o[2:])
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    resolve_external.cache_clear()
    yield
    resolve_external.cache_clear()
    for m in ("exits_on_import", "raises_on_import", "bad_trace"):
        sys.modules.pop(m, None)


def test_a_module_that_raises_or_exits_while_loading_is_one_line(misbehaving, capsys):
    from grpo_jax.protocol import CHECK_MARKER
    out = export.check_config([{"name": "a", "impl": "exits_on_import:X"},
                               {"name": "b", "impl": "raises_on_import:X"}])
    assert [o["ok"] for o in out] == [False, False]
    assert "SystemExit: bye from import" in out[0]["error"], out
    assert "RuntimeError: boom (at " in out[1]["error"], out
    assert "raises_on_import.py:2 in f" in out[1]["error"], out
    assert all("\n" not in o["error"] for o in out)
    err = capsys.readouterr().err
    assert f"{CHECK_MARKER}0\n" in err and f"{CHECK_MARKER}1\n" in err and "Traceback" not in err


@pytest.mark.parametrize("attr,want", [
    ("RAISES", "ValueError: cannot trace (at "),
    ("EXITS", "SystemExit: 3"),
    ("WRONG", "output `loss` is f32[1], SPEC's is f32[]; output `per_token_logp` is f16[3,8]"),
])
def test_a_module_that_fails_while_traced_is_one_line(misbehaving, tmp_path, attr, want):
    res = export.handle_request({"impl": f"bad_trace:{attr}", "b": 3, "t": 8, "v": 300},
                                tmp_path / "cache")
    assert res["status"] == "error", res
    assert want in res["message"] and "\n" not in res["message"], res["message"]
    if attr == "RAISES":
        assert "bad_trace.py:13 in _raise" in res["message"], res["message"]
