"""The whole-loss adapter (``adapters.from_loss_fn``) against the f64 oracle: small
functions in the shape of tunix's ``grpo_loss_fn`` (the aggregated loss and metrics out,
their own config object, a model they call), one right and one that normalises ``grpo``
by the batch's token count (bnpo's rule), which must fail on the loss and its gradient."""

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
class LossConfig:
    """A library's own config, as whole-loss libraries have them."""
    epsilon: float
    epsilon_high: float
    beta: float
    temperature: float
    aggregation: str  # "per-sequence" | "per-token" | "constant"


def config(knobs, options, platform):
    modes = {"grpo": "per-sequence", "bnpo": "per-token", "dr_grpo": "constant"}
    if knobs.max_completion_length is not None:
        raise adapters.Unsupported("max_completion_length: the library divides by T")
    return {"cfg": LossConfig(knobs.epsilon_low, knobs.epsilon_high, knobs.beta,
                              knobs.temperature, modes[knobs.loss_type])}


def _aggregate(x, mask, mode, by_tokens_instead_of_rows=False):
    if mode == "per-token" or (mode == "per-sequence" and by_tokens_instead_of_rows):
        return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if mode == "per-sequence":
        return jnp.mean(jnp.sum(x * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0))
    return jnp.sum(x * mask) / (mask.shape[0] * mask.shape[1])


def _loss(z, ids, old, ref, adv, mask, cfg, wrong=False):
    """(loss, metrics) of the contract, written as a library would (explicit branch at
    ties, masked values sanitised)."""
    lp_all = jax.nn.log_softmax(z.astype(f32) / cfg.temperature, axis=-1)
    logp = jnp.take_along_axis(lp_all, ids[..., None], axis=-1)[..., 0]
    d = jnp.where(mask > 0, logp - old, 0.0)
    r = jnp.exp(d)
    a = adv[:, None]
    rc = jnp.clip(r, 1 - cfg.epsilon, 1 + cfg.epsilon_high)
    pg = jnp.where(r * a <= rc * a, -r * a, jax.lax.stop_gradient(-jnp.minimum(r * a, rc * a)))
    dk = jnp.where(mask > 0, ref - logp, 0.0)
    kl = jnp.exp(dk) - dk - 1.0
    per_token = pg + cfg.beta * kl
    loss = _aggregate(per_token, mask, cfg.aggregation, by_tokens_instead_of_rows=wrong)
    return loss, {"logp": logp, "per_token": per_token}


def arrays_loss(*, logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg):
    return _loss(logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg)


def arrays_loss_bnpo_rule(*, logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg):
    return _loss(logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg, wrong=True)


def model_loss(model, *, chosen_ids, old_logp, ref_logp, advantages, mask, cfg):
    """Calls the model (with the arguments a library passes it) for the logits."""
    return _loss(model(chosen_ids, positions=None), chosen_ids, old_logp, ref_logp,
                 advantages, mask, cfg)


KNOBS = ("epsilon_low", "epsilon_high", "beta", "temperature", "loss_type", "max_completion_length")


def impl_of(fn, level="logits", form="arrays", **kw):
    return adapters.from_loss_fn(fn, id=fn.__name__, level=level, form=form, knobs=KNOBS,
                                 config_factory=config, **kw)


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


P = Problem("logits", 4, 7, 1000, None, "f32")
FUSED = Problem("fused", 3, 6, 500, 32, "f32")


@pytest.mark.parametrize("knobs", [
    dict(epsilon_high=0.28),
    dict(beta=0.04, loss_type="bnpo"),
    dict(temperature=0.7, loss_type="dr_grpo", beta=0.1),
])
@pytest.mark.parametrize("form, fn", [("arrays", arrays_loss), ("model", model_loss)])
def test_a_right_whole_loss_matches_the_oracle_in_both_forms(form, fn, knobs):
    impl = impl_of(fn, form=form, metrics={"per_token_logp": "logp",
                                           "per_token_loss": "per_token"})
    assert impl.not_provided == {"kl", "clipped", "entropy"}
    assert judge(impl, P, knobs) == []


def test_the_model_form_computes_the_fused_logits_and_its_gradients():
    impl = impl_of(model_loss, level="fused", form="model", metrics={"per_token_logp": "logp"})
    assert judge(impl, FUSED, dict(beta=0.04, epsilon_high=0.28)) == []


def test_a_model_factory_wraps_the_stand_in_in_the_librarys_model_type():
    seen = []

    class LibraryModel:
        def __init__(self, stand_in):
            self.params = stand_in.head
            self.forward = stand_in.logits_of

        def __call__(self, tokens, positions=None):
            seen.append(tokens.shape)
            return self.forward(*self.params)
    impl = impl_of(model_loss, form="model", model_factory=LibraryModel)
    assert judge(impl, P, {}) == [] and seen == [(P.b, P.t)]


def test_grpo_normalised_by_the_token_count_fails_on_the_loss_and_its_gradient():
    """bnpo's rule under loss_type grpo: equal only when every row has the same count."""
    errors = judge(impl_of(arrays_loss_bnpo_rule), P, {})
    assert any(e.startswith("loss:") for e in errors), errors
    assert any(e.startswith("dlogits:") for e in errors), errors
    assert judge(impl_of(arrays_loss_bnpo_rule), P, dict(loss_type="bnpo")) == []


def test_outputs_the_library_does_not_give_are_not_provided_and_placeholders():
    impl = impl_of(arrays_loss)
    assert impl.not_provided == {"per_token_logp", "per_token_loss", "kl", "clipped", "entropy"}
    inputs = make_inputs(P, 1)
    out = jax.jit(impl.build(P, Knobs(), {}))(*inputs.values())
    assert all(float(jnp.abs(o).max()) == 0.0 for o in out[1:6])


def test_knobs_the_library_cannot_express_are_unsupported_with_the_reason():
    impl = impl_of(arrays_loss)
    assert impl.support_reason(P, Knobs(delta=2.0), {}) == "not supported: delta (ratio cap)"
    assert "sequence" in impl.support_reason(P, Knobs(importance_sampling_level="sequence"), {})
    assert impl.support_reason(P, Knobs(loss_type="dr_grpo", max_completion_length=9), {}) == \
        "not supported: max_completion_length: the library divides by T"
    narrow = adapters.from_loss_fn(arrays_loss, id="n", level="logits",
                                   knobs=("epsilon_low", "epsilon_high"), config_factory=config)
    assert "loss_type 'bnpo'" in narrow.support_reason(P, Knobs(loss_type="bnpo"), {})
    no_l = adapters.from_loss_fn(arrays_loss, id="n", level="logits", knobs=KNOBS[:-1],
                                 config_factory=config)
    assert no_l.support_reason(P, Knobs(loss_type="dr_grpo", max_completion_length=9), {}) == \
        "not supported: max_completion_length (the loss has no setting for L)"
    assert narrow.support_reason(FUSED, Knobs(), {}).startswith("not applicable")


def test_a_metric_of_the_wrong_shape_or_missing_is_one_line():
    def loss(*, logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg):
        value, m = _loss(logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg)
        return value, {"mean_logp": m["logp"].mean(), "logp": m["logp"]}
    structs = [s.struct() for s in input_specs(P)]
    with pytest.raises(RequestError, match=r"metric 'mean_logp' \(per_token_logp\) has shape"):
        jax.eval_shape(impl_of(loss, metrics={"per_token_logp": "mean_logp"})
                       .build(P, Knobs(), {}), *structs)
    with pytest.raises(RequestError, match="metrics do not have"):
        jax.eval_shape(impl_of(loss, metrics={"entropy": "ent"}).build(P, Knobs(), {}), *structs)


@pytest.mark.parametrize("kw, message", [
    (dict(form="model"), "receives no model"),
    (dict(form="graph"), "form must be one of"),
    (dict(knobs=("temperature",)), "must take epsilon_low and epsilon_high"),
    (dict(knobs=("epsilon_low", "epsilon_high", "tau")), "unknown knob names"),
    (dict(metrics={"dlogits": "x"}), "not a SPEC per-token output"),
    (dict(model_factory=lambda m: m), "for form='model' only"),
])
def test_a_wrong_declaration_is_a_clear_error(kw, message):
    base = dict(fn=arrays_loss, id="x", level="logits", knobs=KNOBS, config_factory=config)
    with pytest.raises(ValueError, match=message):
        adapters.from_loss_fn(**{**base, **kw})
