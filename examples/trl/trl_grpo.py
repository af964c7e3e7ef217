"""TRL 1.16.0's GRPO loss as ``GRPOTrainer`` computes it, without a model or a trainer:
``GRPOTrainer._compute_loss`` and ``GRPOTrainer._get_per_token_logps_and_entropies`` run
unchanged on a stand-in for the trainer (the attributes they read, set from the suite's
knobs: ``_Trainer``) and a stand-in model whose ``log_probs`` and ``entropy`` are TRL's
own ``selective_log_softmax_and_entropy`` of the case's logits at the temperature. So the
clip, KL, loss types and averaging are TRL's code, and the logp is TRL's utility's; the
gradient is autograd's through both. Logits level only.

- The trainer in eval mode (``model.training`` False): no gradient-accumulation divisor.
- One prompt token of id 0 before the completion (``_compute_loss`` concatenates them;
  the stand-in model gives it logp 0 and TRL slices it off with ``logits_to_keep``).
- ``per_token_logp`` and ``entropy`` are the stand-in model's, i.e. TRL's utility's;
  ``per_token_loss``, ``kl`` and ``clipped`` are not returned by TRL: "not provided".
"""

import contextlib
from collections import defaultdict
from types import SimpleNamespace

import torch
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import selective_log_softmax_and_entropy

from grpo_torch.interface import Implementation


class _Accelerator:
    """One process: gather and reduce are the identity."""

    num_processes = 1
    sync_gradients = True
    is_main_process = True

    def autocast(self):
        return contextlib.nullcontext()

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


class _Model:
    """Returns TRL's own log-probabilities and entropies of the case's logits."""

    training = False

    def __init__(self, logits, temperature):
        self.logits, self.temperature = logits, temperature

    def __call__(self, input_ids, attention_mask, labels, fused_lm_head, **kw):
        t = self.logits.shape[1]
        ids = input_ids[:, -t:]
        logp, entropy = selective_log_softmax_and_entropy(self.logits, ids, temperature=self.temperature)
        pad = torch.zeros(ids.shape[0], input_ids.shape[1] - t, dtype=logp.dtype)
        self.seen = (logp, entropy)
        return SimpleNamespace(log_probs=torch.cat([pad, logp], 1),
                               entropy=torch.cat([pad.to(entropy.dtype), entropy], 1))


class _Trainer:
    """What ``_compute_loss`` reads of a GRPOTrainer, from the suite's knobs."""

    _compute_loss = GRPOTrainer._compute_loss
    _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies

    def __init__(self, knobs, model, t):
        self.model = model
        self.beta = knobs["beta"]
        self.epsilon_low = knobs["epsilon_low"]
        self.epsilon_high = knobs["epsilon_high"]
        self.loss_type = knobs["loss_type"]
        self.importance_sampling_level = knobs["importance_sampling_level"]
        self.max_completion_length = knobs.get("max_completion_length") or t
        self.temperature = knobs["temperature"]
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.accelerator = _Accelerator()
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.args = SimpleNamespace(use_bias_correction_kl=False, delta=knobs.get("delta"))


def _loss(head, batch, knobs, options):
    logits = head["logits"]
    b, t = batch["mask"].shape
    model = _Model(logits, knobs["temperature"])
    trainer = _Trainer(knobs, model, t)
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": batch["chosen_ids"],
        "completion_mask": batch["mask"],
        "advantages": batch["advantages"],
        "old_per_token_logps": batch["old_logp"],
        "ref_per_token_logps": batch["ref_logp"],
    }
    loss = trainer._compute_loss(model, inputs)
    logp, entropy = model.seen
    return loss, {"per_token_logp": logp.detach().float(), "entropy": entropy.detach().float()}


LOGITS = Implementation(name="trl_grpo", loss=_loss, levels=("logits",))
