"""The per-token-loss adapter (``adapters.from_per_token_loss_fn``) against the f64 oracle:
kernels in the shape of the seeds' (per-token loss and logp out, clipping in a custom VJP,
their own config object and parameter names), and what the adapter must refuse."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest

from grpo_jax import adapters
from grpo_jax.spec import Knobs, Problem, RequestError, input_specs, output_specs
from helpers import compare, make_inputs
from oracle import oracle

f32 = jnp.float32


@dataclass(frozen=True)
class Cfg:
    """A kernel's own frozen config, as training repositories have them."""
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    temperature: float = 1.0


def _terms(logp, old, adv, cfg):
    """Per-token clipped loss (no mask: the kernel does not take one). Masked positions
    hold hostile old_logp in the ci data; a sound kernel still stays finite there only if
    it never exponentiates them, so this one clamps the log-ratio the way SPEC's value
    does not depend on (masked values are free)."""
    r = jnp.exp(jnp.clip(logp - old, -60.0, 60.0))
    a = adv[:, None]
    unclipped = r * a <= jnp.clip(r, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high) * a
    value = -jnp.minimum(r * a, jnp.clip(r, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high) * a)
    return jnp.where(unclipped, -r * a, jax.lax.stop_gradient(value))


def _logp(logits, ids, temperature):
    z = logits.astype(f32) / temperature
    lp = jax.nn.log_softmax(z, axis=-1)
    ent = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
    return jnp.take_along_axis(lp, ids[..., None], axis=-1)[..., 0], ent


def honest_kernel(*, logits, chosen_ids, old_per_token_logps, advantages, cfg, interpret):
    """(per_token_loss, logp, entropy), plain autodiff: both cotangents reach the logits."""
    assert interpret in (True, False)
    logp, ent = _logp(logits, chosen_ids, cfg.temperature)
    return _terms(logp, old_per_token_logps, advantages, cfg), logp, jax.lax.stop_gradient(ent)


def _seeds_style(logits, ids, old, adv, cfg):
    """The seeds' VJP: the backward reads only the loss cotangent (logp's is dropped)."""
    @jax.custom_vjp
    def kernel(z):
        logp, _ = _logp(z, ids, cfg.temperature)
        return _terms(logp, old, adv, cfg), logp

    def fwd(z):
        return kernel(z), z

    def bwd(z, g):
        dloss, _dlogp = g
        _, pull = jax.vjp(lambda z_: _terms(_logp(z_, ids, cfg.temperature)[0], old, adv, cfg), z)
        return pull(dloss)
    kernel.defvjp(fwd, bwd)
    return kernel(logits)


def drops_logp_kernel(*, logits, chosen_ids, old_per_token_logps, advantages, cfg):
    return _seeds_style(logits, chosen_ids, old_per_token_logps, advantages, cfg)


def config(knobs, options, platform):
    assert platform in ("cpu", "tpu") and options == {"block": 128}
    return {"cfg": Cfg(knobs.epsilon_low, knobs.epsilon_high, knobs.temperature)}


def impl_of(fn, returns="loss_logp", **kw):
    return adapters.from_per_token_loss_fn(
        fn, id=fn.__name__, level="logits", returns=returns,
        inputs={"old_per_token_logps": "old_logp"},
        knobs=("epsilon_low", "epsilon_high", "temperature"), config_factory=config,
        default_options={"block": 128}, **kw)


def judge(impl, problem, knobs_json, seed=1):
    inputs = make_inputs(problem, seed)
    knobs = Knobs.from_json(knobs_json)
    options = impl.resolve_options({})
    assert impl.support_reason(problem, knobs, options) is None
    fn = jax.jit(impl.build(problem, knobs, options))
    got = {s.name: jax.device_get(o) for s, o in zip(output_specs(problem), fn(*inputs.values()))}
    want = oracle(inputs, knobs.to_json(), problem.level)
    for name in impl.not_provided:
        got.pop(name), want.pop(name)
    return compare(got, want, inputs["mask"], problem.dtype)


P = Problem("logits", 3, 7, 1000, None, "f32")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("knobs", [
    dict(),
    dict(beta=0.04, loss_type="bnpo", epsilon_high=0.28),
    dict(temperature=0.7, loss_type="dr_grpo", max_completion_length=9),
])
def test_an_honest_per_token_kernel_matches_the_oracle(dtype, knobs):
    impl = impl_of(honest_kernel, returns="loss_logp_entropy")
    assert impl.not_provided == frozenset()
    assert judge(impl, Problem("logits", 3, 7, 1000, None, dtype), knobs) == []


def test_the_seeds_vjp_passes_without_kl_and_is_one_line_with_it():
    impl = impl_of(drops_logp_kernel)
    assert impl.not_provided == {"entropy"}
    assert judge(impl, P, dict(epsilon_high=0.28)) == []
    with pytest.raises(RequestError, match="drops the cotangent of per_token_logp"):
        impl.build(P, Knobs(beta=0.04), impl.resolve_options({}))
    # the honest kernel passes the same probe
    impl_of(honest_kernel, returns="loss_logp_entropy").build(P, Knobs(beta=0.04), {"block": 128})


def test_a_wrong_per_token_loss_fails_the_oracle():
    def wrong_kernel(*, logits, chosen_ids, old_per_token_logps, advantages, cfg, interpret):
        loss, logp, ent = honest_kernel(logits=logits, chosen_ids=chosen_ids,
                                        old_per_token_logps=old_per_token_logps,
                                        advantages=advantages, cfg=cfg, interpret=interpret)
        return loss * 1.01, logp, ent  # 1% too large
    errors = judge(impl_of(wrong_kernel, returns="loss_logp_entropy"), P, {})
    assert any(e.startswith("loss") for e in errors) and any("dlogits" in e for e in errors)


def test_a_declared_convention_is_never_judged_and_knobs_not_taken_are_refused():
    impl = impl_of(honest_kernel, returns="loss_logp_entropy",
                   conventions={"temperature": "log_softmax(z)/τ"})
    opts = impl.resolve_options({})
    assert impl.support_reason(P, Knobs(temperature=0.7), opts) == \
        "convention differs: temperature: log_softmax(z)/τ"
    assert impl.support_reason(P, Knobs(), opts) is None
    assert "delta" in impl.support_reason(P, Knobs(delta=2.0), opts)
    assert "sequence" in impl.support_reason(P, Knobs(importance_sampling_level="sequence"), opts)
    fused = Problem("fused", 2, 4, 300, 16, "f32")
    assert impl.support_reason(fused, Knobs(), opts).startswith("not applicable")


def test_interpret_follows_the_platform_unless_set():
    seen = []

    def kernel(*, logits, chosen_ids, old_logp, advantages, epsilon_low, epsilon_high, interpret):
        seen.append(interpret)
        logp, _ = _logp(logits, chosen_ids, 1.0)
        return _terms(logp, old_logp, advantages, Cfg(epsilon_low, epsilon_high)), logp
    impl = adapters.from_per_token_loss_fn(kernel, id="k", level="logits")
    for platform in ("cpu", "tpu"):
        p = Problem("logits", 2, 4, 300, None, "f32", platform)
        jax.eval_shape(impl.build(p, Knobs(), {}), *[s.struct() for s in input_specs(p)])
    assert seen == [True, False]
    set_by_options = adapters.from_per_token_loss_fn(kernel, id="k", level="logits",
                                                     default_options={"interpret": True})
    p = Problem("logits", 2, 4, 300, None, "f32", "tpu")
    jax.eval_shape(set_by_options.build(p, Knobs(), {"interpret": True}),
                   *[s.struct() for s in input_specs(p)])
    assert seen[-1] is True


def test_fused_level_with_per_token_advantages():
    def fused(*, hidden_states, lm_head_kernel, chosen_ids, old_logp, adv_tok,
              epsilon_low, epsilon_high):
        z = jnp.einsum("bth,hv->btv", hidden_states, lm_head_kernel, preferred_element_type=f32)
        logp, _ = _logp(z, chosen_ids, 1.0)
        loss = _terms(logp, old_logp, adv_tok[:, 0], Cfg(epsilon_low, epsilon_high))
        return loss, logp
    impl = adapters.from_per_token_loss_fn(
        fused, id="fz", level="fused",
        inputs={"hidden_states": "hidden", "lm_head_kernel": "lm_head",
                "adv_tok": "advantages_per_token"})
    assert judge(impl, Problem("fused", 2, 6, 500, 32, "f32"), dict(beta=0.04)) == []
    assert "logits_dtype" in impl.support_reason(
        Problem("fused", 2, 6, 500, 32, "bf16"), Knobs(logits_dtype="input"), {})


@pytest.mark.parametrize("kw, message", [
    (dict(inputs={"nope": "old_logp"}), "not a parameter"),
    (dict(inputs={"old_per_token_logps": "old_lgp"}), "not a SPEC input or knob"),
    (dict(knobs=("temperature",)), "must take epsilon_low and epsilon_high"),
    (dict(knobs=("epsilon_low", "epsilon_high", "tau")), "unknown knob names"),
    (dict(conventions={"tau": "x"}), "not a knob"),
    (dict(returns="loss"), "returns must be one of"),
])
def test_a_wrong_declaration_is_a_clear_error(kw, message):
    base = dict(fn=drops_logp_kernel, id="x", level="logits",
                inputs={"old_per_token_logps": "old_logp"},
                knobs=("epsilon_low", "epsilon_high"), config_factory=config)
    with pytest.raises(ValueError, match=message):
        adapters.from_per_token_loss_fn(**{**base, **kw})


def test_a_kernel_without_old_logp_is_refused_at_declaration():
    def k(*, logits, chosen_ids, advantages, cfg):
        return logits[..., 0], logits[..., 0]
    with pytest.raises(ValueError, match="receives no old_logp"):
        adapters.from_per_token_loss_fn(k, id="k", level="logits",
                                        knobs=("epsilon_low", "epsilon_high"))


def _sharded(impl, problem, knobs, inputs, devices, sharding):
    from grpo_jax.impls import sharded
    import numpy as np
    opts = impl.resolve_options({})
    assert sharded.support_reason(impl, problem, devices, sharding) is None
    fn = sharded.build(impl, problem, knobs, opts, devices, sharding)
    ins, outs = sharded.shardings(problem, sharding, devices)
    out = jax.jit(fn, in_shardings=ins, out_shardings=outs)(*inputs.values())
    return {s.name: np.asarray(jax.device_get(o)) for s, o in zip(output_specs(problem), out)}


@pytest.mark.parametrize("knobs", [dict(loss_type="bnpo"), dict(beta=0.04, loss_type="grpo"),
                                   dict(loss_type="dr_grpo", epsilon_high=0.28)])
def test_adapters_run_batch_sharded_with_global_normalisers(knobs):
    """4 devices, B = 8: the kernel on each device's 2 rows, the aggregation global
    (bnpo's mask total spans devices: a per-device normaliser would fail the oracle)."""
    from grpo_jax.impls import sharded
    p = Problem("logits", 8, 6, 1000, None, "f32")
    inputs = make_inputs(p, 5)
    k = Knobs.from_json(knobs)
    for impl in (impl_of(honest_kernel, returns="loss_logp_entropy"),
                 adapters.from_logits_fn(lambda logits, chosen_ids: _logp(logits, chosen_ids, 1.0),
                                         id="lp", returns="logp_entropy")):
        got = _sharded(impl, p, k, inputs, 4, "batch")
        want = oracle(inputs, k.to_json(), "logits")
        assert compare(got, want, inputs["mask"], "f32") == [], impl.id
        assert "batch-sharded only" in sharded.support_reason(impl, p, 4, "vocab")
    fused = adapters.from_fused_fn(lambda hidden, lm_head, chosen_ids: _logp(
        jnp.einsum("bth,hv->btv", hidden, lm_head, preferred_element_type=f32), chosen_ids, 1.0)[0],
        id="fz")
    pf = Problem("fused", 8, 4, 700, 24, "f32")
    inputs = make_inputs(pf, 6)
    got = _sharded(fused, pf, k, inputs, 4, "batch")
    got.pop("entropy")
    want = oracle(inputs, k.to_json(), "fused")
    want.pop("entropy")
    assert compare(got, want, inputs["mask"], "f32") == []


def test_the_mllm_jax_example_uses_the_public_adapter_only():
    """examples/mllm_jax wraps the seeds' kernels by config alone: from grpo_jax it imports
    the adapters module and nothing else (no suite internals)."""
    import ast
    from pathlib import Path
    src = Path(__file__).resolve().parents[3] / "examples" / "mllm_jax" / "mllm_grpo.py"
    tree = ast.parse(src.read_text())
    ours = [n.module if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in (n.names if isinstance(n, ast.Import) else [None])
            if (n.module if isinstance(n, ast.ImportFrom) else a.name or "").startswith("grpo_jax")]
    assert ours == ["grpo_jax.adapters"], ours
