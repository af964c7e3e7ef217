"""tunix's GRPO loss (PyPI google-tunix 0.1.7, ``tunix.rl.algo_core.grpo_loss_fn``, the loss
of tunix's GRPOLearner and of MaxText's RL trainer) as SPEC implementations, judged as it
is through the public whole-loss adapter ``from_loss_fn``.

The adapter hands tunix a stand-in model whose logits are the case's (or hidden @ lm_head at
the fused level); tunix calls it, averages by its own ``loss_agg_mode`` and returns the
loss. The gradients are ``jax.value_and_grad`` through tunix's code. The knobs map onto
tunix's own ``GRPOConfig`` in ``config`` below; one it has no setting for is unsupported.
``per_token_logp`` and ``entropy`` are tunix's own per-token values (``compute_per_token_logps``,
the function its learner takes old and reference logps from, and
``compute_entropy_from_logits``, whose aggregate its loss reports); the loss exposes no
per-token loss, KL or clip indicator, so those are not provided.
"""

from flax import nnx
import jax.numpy as jnp
from tunix.rl import algo_core, common
from tunix.rl.grpo.grpo_learner import GRPOConfig, TrainExample

from grpo_jax.adapters import Unsupported, from_loss_fn

# SPEC loss_type -> tunix loss_agg_mode (tunix/rl/common.py, aggregate_loss).
AGGREGATION = {"grpo": "sequence-mean-token-mean", "bnpo": "token-mean",
               "dr_grpo": "sequence-mean-token-scale"}
PAD_ID, EOS_ID = -1, -2  # no token of a case is padding to tunix: the mask says what counts


def config(knobs, options, platform):
    """SPEC's knobs as tunix's GRPOConfig (set as tunix's GRPOLearner sets it). The option
    ``kl_loss_mode`` is SPEC's k3 ("low_var_kl") unless an entry sets tunix's default,
    "kl" (k1), which MaxText's RL trainer keeps."""
    if knobs.max_completion_length is not None:
        raise Unsupported("max_completion_length: tunix's sequence-mean-token-scale divides "
                          "by T (grpo_loss_fn passes no norm to aggregate_loss)")
    cfg = GRPOConfig(beta=knobs.beta, epsilon=knobs.epsilon_low,
                     loss_agg_mode=AGGREGATION[knobs.loss_type],
                     loss_algo="gspo-token" if knobs.importance_sampling_level == "sequence"
                     else "grpo",
                     kl_loss_mode=options["kl_loss_mode"])
    cfg.epsilon_high = knobs.epsilon_high
    cfg.temperature = knobs.temperature      # GRPOLearner copies the rollout's temperature
    cfg.epsilon_c = knobs.delta              # dual-clip: caps -r·A at -δ·A for A < 0
    return {"algo_config": cfg}


class StandIn(nnx.Module):
    """The policy tunix calls: its parameters are the case's head arrays, its output the
    case's logits. tunix keeps logits[:, -T-1:-1] of prompt + completion (position j
    predicts token j + 1), so with a one-token prompt the case's logits come first."""

    def __init__(self, stand_in):
        self.names = ("logits",) if stand_in.level == "logits" else ("hidden", "lm_head")
        for name, x in zip(self.names, stand_in.head):
            setattr(self, name, nnx.Param(x))
        self.logits_of = stand_in.logits_of

    def __call__(self, tokens, positions=None, cache=None, attention_mask=None):
        z = self.logits_of(*(getattr(self, n)[...] for n in self.names))
        return jnp.pad(z, ((0, 0), (0, 1), (0, 0))), None


def grpo_loss(model, chosen_ids, old_logp, ref_logp, advantages, mask, beta, temperature,
              algo_config):
    b = chosen_ids.shape[0]
    prompt = jnp.zeros((b, 1), jnp.int32)
    example = TrainExample(
        prompt_ids=prompt, prompt_mask=jnp.ones((b, 1), jnp.int32),
        completion_ids=chosen_ids, completion_mask=mask, advantages=advantages,
        ref_per_token_logps=ref_logp if beta != 0 else None, old_per_token_logps=old_logp)
    loss, aux = algo_core.grpo_loss_fn(model, example, algo_config, PAD_ID, EOS_ID)
    graphdef, state = nnx.split(model)
    logp, logits = common.compute_per_token_logps(
        graphdef, state, prompt_tokens=prompt, completion_tokens=chosen_ids, pad_id=PAD_ID,
        eos_id=EOS_ID, return_logits=True, temperature=temperature)
    aux = dict(aux, per_token_logp=logp, entropy=algo_core.compute_entropy_from_logits(logits))
    return loss, aux


KNOBS = ("epsilon_low", "epsilon_high", "beta", "temperature", "delta", "loss_type",
         "importance_sampling_level", "max_completion_length")
METRICS = {"per_token_logp": "per_token_logp", "entropy": "entropy"}
OPTIONS = {"kl_loss_mode": "low_var_kl"}  # SPEC's k3; tunix's GRPOConfig default is "kl" (k1)

LOGITS = from_loss_fn(grpo_loss, id="tunix_logits", level="logits", form="model",
                      knobs=KNOBS, config_factory=config, metrics=METRICS,
                      model_factory=StandIn, default_options=OPTIONS,
                      description="tunix 0.1.7 grpo_loss_fn (algo_core.py), logits level")
FUSED = from_loss_fn(grpo_loss, id="tunix_fused", level="fused", form="model",
                     knobs=KNOBS, config_factory=config, metrics=METRICS,
                     model_factory=StandIn, default_options=OPTIONS,
                     description="tunix 0.1.7 grpo_loss_fn (algo_core.py), the stand-in model "
                                 "computing hidden @ lm_head")
