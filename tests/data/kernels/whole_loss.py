"""Small whole-loss functions in the shape of tunix's grpo_loss_fn (the aggregated loss and
metrics out, a config object of their own), through grpo_jax.adapters.from_loss_fn in both
forms: a right one, and one that normalises `grpo` by the batch's token count (bnpo's rule:
equal only when every row has the same number of live tokens). tests/external.rs checks
that the suite passes the first and fails the second on the loss, naming it."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from grpo_jax.adapters import Unsupported, from_loss_fn

f32 = jnp.float32


@dataclass(frozen=True)
class Cfg:
    epsilon: float
    epsilon_high: float
    beta: float
    per_token: bool          # bnpo's normaliser
    token_count_for_rows: bool = False


def config_of(wrong):
    def config(knobs, options, platform):
        if knobs.loss_type == "dr_grpo":
            raise Unsupported("loss_type dr_grpo: this library has no such aggregation")
        return {"cfg": Cfg(knobs.epsilon_low, knobs.epsilon_high, knobs.beta,
                           knobs.loss_type == "bnpo", wrong)}
    return config


def _loss(z, ids, old, ref, adv, mask, cfg):
    lp = jax.nn.log_softmax(z.astype(f32), axis=-1)
    logp = jnp.take_along_axis(lp, ids[..., None], axis=-1)[..., 0]
    r = jnp.exp(jnp.where(mask > 0, logp - old, 0.0))
    a = adv[:, None]
    rc = jnp.clip(r, 1 - cfg.epsilon, 1 + cfg.epsilon_high)
    pg = jnp.where(r * a <= rc * a, -r * a, jax.lax.stop_gradient(-jnp.minimum(r * a, rc * a)))
    d = jnp.where(mask > 0, ref - logp, 0.0)
    per_token = pg + cfg.beta * (jnp.exp(d) - d - 1.0)
    masked = jnp.where(mask > 0, per_token, 0.0)
    if cfg.per_token or cfg.token_count_for_rows:
        loss = masked.sum() / jnp.maximum(mask.sum(), 1.0)
    else:
        loss = jnp.mean(masked.sum(-1) / jnp.maximum(mask.sum(-1), 1.0))
    return loss, {"logp": logp}


def arrays(*, logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg):
    return _loss(logits, chosen_ids, old_logp, ref_logp, advantages, mask, cfg)


def model(model, *, chosen_ids, old_logp, ref_logp, advantages, mask, cfg):
    return _loss(model(chosen_ids), chosen_ids, old_logp, ref_logp, advantages, mask, cfg)


KNOBS = ("epsilon_low", "epsilon_high", "beta", "loss_type")
METRICS = {"per_token_logp": "logp"}


def make(fn, form, wrong, name):
    return from_loss_fn(fn, id=name, level="logits", form=form, knobs=KNOBS,
                        config_factory=config_of(wrong), metrics=METRICS)


ARRAYS = make(arrays, "arrays", False, "whole_arrays")
MODEL = make(model, "model", False, "whole_model")
ARRAYS_BNPO_RULE = make(arrays, "arrays", True, "whole_arrays_bnpo_rule")
MODEL_BNPO_RULE = make(model, "model", True, "whole_model_bnpo_rule")
