"""What a torch implementation provides to the suite's worker (docs/external.md, "A
PyTorch kernel").

An implementation computes the loss and the per-token metrics it has from the case's
tensors; the worker differentiates the loss with ``torch.autograd`` through it (its own
backward is what runs) and returns the gradients of the head inputs (``logits``, or
``hidden`` and ``lm_head``). A metric it does not give is "not provided", never computed
by the suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

METRICS = ("per_token_logp", "per_token_loss", "kl", "clipped", "entropy")


@dataclass(frozen=True)
class Problem:
    """One case's shapes and input dtype (``f32``, ``bf16``, ``f16``)."""

    level: str
    b: int
    t: int
    v: int
    h: Optional[int]
    dtype: str
    device: str = "cpu"


@dataclass
class Implementation:
    """A loss the worker runs.

    ``loss(head, batch, knobs, options) -> (loss, metrics)``: ``head`` holds ``logits``
    or ``hidden`` and ``lm_head`` (requires_grad, in the input dtype), ``batch`` the
    other inputs (``chosen_ids`` int64, the rest f32), ``knobs`` SPEC's knobs as a dict;
    ``metrics`` maps names of :data:`METRICS` to [B, T] tensors (those it gives).
    ``supports(problem, knobs, options)`` returns why a case cannot run (an ignored
    trial), or None.
    """

    name: str
    loss: Callable[..., Any]
    levels: tuple = ("logits", "fused")
    dtypes: tuple = ("f32", "bf16", "f16")
    supports: Optional[Callable[[Problem, Mapping[str, Any], Mapping[str, Any]], Optional[str]]] = None
    default_options: dict = field(default_factory=dict)

    def unsupported(self, problem: Problem, knobs: Mapping[str, Any],
                    options: Mapping[str, Any]) -> Optional[str]:
        """Why this case is not run here, or None."""
        if problem.level not in self.levels:
            return f"not applicable: {self.name} runs the {'/'.join(self.levels)} level only"
        if problem.dtype not in self.dtypes:
            return f"{self.name} takes {'/'.join(self.dtypes)} inputs, not {problem.dtype}"
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            return f"error: {self.name} has no options {unknown} (it has {sorted(self.default_options)})"
        if self.supports is not None:
            return self.supports(problem, knobs, {**self.default_options, **options})
        return None
