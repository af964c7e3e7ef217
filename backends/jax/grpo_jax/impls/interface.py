"""What an implementation declares: an id, a builder, its capabilities and its options.

A builder has the signature ``build(problem, knobs, options) -> fn`` where ``fn`` takes
every input of ``spec.input_specs(problem)`` positionally (SPEC order) and returns the
tuple of ``spec.output_specs(problem)`` (loss, per-token metrics, gradients). ``fn`` must
be jit-traceable; the exporter wraps it in ``jax.jit`` and ``jax.export``.

``support_reason`` answers "can this implementation run this case?" with ``None`` (yes)
or a human-readable reason (the exporter then reports ``unsupported``, never an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..spec import (INPUT_DTYPES, IS_LEVELS, LEVELS, LOGITS_DTYPES, LOSS_TYPES, PLATFORMS,
                    Knobs, Problem, RequestError)

Builder = Callable[[Problem, Knobs, Mapping[str, Any]], Callable[..., tuple]]
# Optional extra check: returns an "unsupported" reason or None; may raise RequestError
# for option values that are invalid (rather than merely unsupported).
ExtraCheck = Callable[[Problem, Knobs, Mapping[str, Any]], Optional[str]]
# Optional option validation without a case (raises RequestError): lets the Rust side
# reject a bad option when the configuration loads, not at the first export.
OptionCheck = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True)
class Capabilities:
    """The cases an implementation handles. Anything outside is reported unsupported."""

    levels: frozenset = frozenset(LEVELS)
    dtypes: frozenset = frozenset(INPUT_DTYPES)
    platforms: frozenset = frozenset(PLATFORMS)
    loss_types: frozenset = frozenset(LOSS_TYPES)
    importance_sampling_levels: frozenset = frozenset(IS_LEVELS)
    logits_dtypes: frozenset = frozenset(LOGITS_DTYPES)  # fused level only
    delta: bool = True          # a set ``delta`` knob
    beta: bool = True           # beta != 0 (the KL term)
    temperature: bool = True    # temperature != 1
    mosaic_tpu: bool = False    # a Pallas TPU (Mosaic) kernel: no GPU lowering

    def reason(self, p: Problem, k: Knobs) -> Optional[str]:
        """None if the case is inside these capabilities, else why not. A case of a level
        the implementation does not have is not applicable rather than unsupported (the
        suite neither shows nor counts it as ignored)."""
        if p.level not in self.levels:
            return f"not applicable: level {p.level!r}"
        checks = [
            (p.dtype in self.dtypes, f"dtype {p.dtype!r}"),
            (p.platform in self.platforms,
             "Mosaic TPU kernel (no GPU lowering)" if self.mosaic_tpu and p.platform == "cuda"
             else f"platform {p.platform!r}"),
            (k.loss_type in self.loss_types, f"loss_type {k.loss_type!r}"),
            (k.importance_sampling_level in self.importance_sampling_levels,
             f"importance_sampling_level {k.importance_sampling_level!r}"),
            (p.level != "fused" or k.logits_dtype in self.logits_dtypes,
             f"logits_dtype {k.logits_dtype!r}"),
            (self.delta or k.delta is None, "delta (ratio cap)"),
            (self.beta or k.beta == 0, "beta != 0 (KL term)"),
            (self.temperature or k.temperature == 1.0, "temperature != 1"),
        ]
        missing = [what for ok, what in checks if not ok]
        return f"not supported: {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class Implementation:
    """One implementation under test (an entry of ``registry.IMPLEMENTATIONS``)."""

    id: str
    description: str
    build: Builder
    capabilities: Capabilities = field(default_factory=Capabilities)
    default_options: Mapping[str, Any] = field(default_factory=dict)
    extra_check: Optional[ExtraCheck] = None
    validate_options: Optional[OptionCheck] = None
    # SPEC outputs the implementation cannot produce (e.g. "entropy" for a kernel that
    # returns logp only). Its function still returns a placeholder there (the module's
    # outputs are SPEC's); the manifest lists them and the suite never gates them.
    not_provided: frozenset = frozenset()
    # The differentiable per-token core, for the multi-device wrappers (impls/sharded.py):
    # ``per_token(problem, knobs, options)`` -> ``f(logits, ids)`` or
    # ``f(hidden, lm_head, ids, valid_v=None)`` -> (logp [B, T] f32, entropy [B, T] f32),
    # differentiable in logits / hidden / lm_head with SPEC's gradient (entropy: none).
    # ``valid_v`` (fused level, a traced int32 count) marks columns >= it as padding that
    # must never enter the logsumexp. A chosen id of −1 selects no column: logp is then
    # −logsumexp, with its gradient (the vocab-parallel wrapper relies on it).
    # Fused level, for the vocab-parallel wrapper (impls/vocab_fused.py): the keyword
    # ``with_lse=True`` adds a third output, the row's logsumexp lse [B, T], differentiable
    # (its cotangent enters the softmax coefficient: dz = (g·onehot − (g − g_lse)·p) / τ);
    # and ``hidden`` may come in f32 holding values of lm_head's dtype, in which case
    # dhidden comes back in f32 unrounded (the wrapper sums shards' partials in f32).
    # None: the implementation runs on one device only.
    per_token: Optional[Callable] = None
    # Batch sharding without a per_token core (the adapters around users' kernels):
    # ``build_batch_sharded(problem, knobs, options, batch_map)`` -> the SPEC function on
    # the global arrays, where ``batch_map(f, nargs, replicated=())`` wraps a function of
    # ``nargs`` arrays, each split on B except the positions in ``replicated`` (lm_head),
    # returning per-sequence arrays, to run on each device's shard (``jax.shard_map``).
    # Every normaliser stays global: the aggregation runs outside, on global arrays.
    build_batch_sharded: Optional[Callable] = None
    # The option values worth comparing on TPU (``grpo-suite sweep``): option -> values;
    # the sweep compiles every combination deviceless. Empty: nothing to sweep.
    search_space: Mapping[str, tuple] = field(default_factory=dict)
    # What the implementation declares about reduced precision, given its resolved
    # options: None (the default: every matmul with f32 operands must be full precision on
    # an accelerator; one at DEFAULT or HIGH fails on tpu and cuda) or the declaration as
    # one line (e.g. "matmul_precision: default"), which lets such matmuls through: their
    # CPU run is then judged on the emulated numbers (docs/spec.md, "Precision").
    reduced_precision: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None
    # The precision class (docs/spec.md, "Precision classes": "f32", "bf16x3", "tf32",
    # "bf16") an option set makes the gradient products, when its options name one that
    # the module's f32 dots cannot show (dz rounded to bf16 before a bf16 × bf16 product):
    # ``option_class(options, dtype)`` -> a class or None (nothing to say). The manifest
    # carries it; the suite judges the module at the looser of it and its dots' class.
    option_class: Optional[Callable[[Mapping[str, Any], str], Optional[str]]] = None

    def declared_class(self, options: Mapping[str, Any], dtype: str) -> Optional[str]:
        """The class the options name for inputs of ``dtype``, or None."""
        if self.option_class is None:
            return None
        c = self.option_class(options, dtype)
        if c is not None and c not in ("f32", "bf16x3", "tf32", "bf16"):
            raise RequestError(f"{self.id}: option_class returned {c!r}, not a precision class")
        return c

    def declared_precision(self, options: Mapping[str, Any]) -> Optional[str]:
        """The declaration of reduced precision under ``options``, or None."""
        if self.reduced_precision is None:
            return None
        declared = self.reduced_precision(options)
        if declared is None:
            return None
        # A declaration names what is reduced: "" or False would read as declared while
        # saying nothing, and excuse every DEFAULT f32 matmul of the module.
        if not isinstance(declared, str) or not declared.strip():
            raise RequestError(
                f"{self.id}: reduced_precision must return None or a non-empty string "
                f"naming the reduced precision (e.g. \"matmul_precision: default\"), "
                f"got {declared!r}")
        return declared

    def resolve_options(self, options: Mapping[str, Any]) -> dict:
        """Defaults merged with the request's ``impl_options``; unknown keys are errors."""
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            raise RequestError(
                f"unknown impl_options for {self.id}: {unknown} "
                f"(known: {sorted(self.default_options)})")
        return {**self.default_options, **options}

    def check_options(self, options: Mapping[str, Any]) -> dict:
        """``resolve_options`` plus the implementation's own value checks (RequestError)."""
        merged = self.resolve_options(options)
        if self.validate_options is not None:
            self.validate_options(merged)
        return merged

    def support_reason(self, p: Problem, k: Knobs, options: Mapping[str, Any]) -> Optional[str]:
        """None when this implementation runs the case, else the unsupported reason."""
        reason = self.capabilities.reason(p, k)
        if reason is None and self.extra_check is not None:
            reason = self.extra_check(p, k, options)
        return reason
