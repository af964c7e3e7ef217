"""Apple's Cut Cross-Entropy 25.1.1 (``cut_cross_entropy.linear_cross_entropy``) as a
fused log-probability function: ``-linear_cross_entropy(hidden, lm_head.T, ids,
reduction="none")``, through ``grpo_torch.adapters.from_fused_fn`` (SPEC's loss around it
is the suite's contract). On cpu CCE runs its ``torch_compile`` implementation (its
Triton ``cce`` one needs a GPU). CCE has no temperature: τ ≠ 1 is unsupported.
"""

from cut_cross_entropy import linear_cross_entropy

from grpo_torch.adapters import from_fused_fn


def _ce(hidden, lm_head, ids, knobs, options):
    impl = "cce" if hidden.is_cuda else "torch_compile"
    return linear_cross_entropy(hidden, lm_head.t(), ids, reduction="none", impl=impl)


def _supports(problem, knobs, options):
    if knobs["temperature"] != 1.0:
        return "τ ≠ 1: linear_cross_entropy has no temperature (its softcap is another function)"
    return None


FUSED = from_fused_fn("cce_linear_cross_entropy", _ce, returns="cross_entropy", supports=_supports)
