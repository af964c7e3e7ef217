"""Test helpers: deterministic inputs, running an implementation directly, comparisons."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np

from grpo_jax.impls import get
from grpo_jax.spec import Knobs, Problem, input_specs, output_specs
from oracle import logits_of

NP_DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}

# Gradient tolerance relative to the gradient's max |value|: about 1.5x the unit roundoff
# of the output dtype (bf16 2^-8, f16 2^-11); f32 measured ~1e-6 at V=2049.
TOLERANCES = {"f32": 1e-5, "bf16": 6e-3, "f16": 8e-4}
# f32 outputs (loss, per-token metrics): absolute, times max(1, max |value|).
F32_OUTPUT_TOL = 5e-6


def make_mask(b: int, t: int) -> np.ndarray:
    """Row 0 partial (prefix), row 1 full, row 2 all zero, further rows random."""
    rng = np.random.default_rng(1234)
    m = np.ones((b, t), np.float32)
    m[0, max(1, t // 2 + 1):] = 0
    if b > 2:
        m[2] = 0
    for i in range(3, b):
        m[i] = (rng.random(t) < 0.7).astype(np.float32)
    return m


def make_inputs(problem: Problem, seed: int = 0, *, ratio_noise: float = 0.3) -> dict:
    """Inputs of a case in SPEC order (numpy, exact in their dtypes).

    old_logp/ref_logp are the true logp plus noise, so ratios straddle both clip edges.
    Masked positions get extreme old/ref values: they must not leak into anything.
    Fused inputs are small dyadic rationals so hidden @ lm_head is exact in f32 and f64.
    """
    rng = np.random.default_rng(seed)
    b, t, v, h = problem.b, problem.t, problem.v, problem.h
    dt = NP_DTYPES[problem.dtype]
    inputs: dict = {}
    if problem.level == "logits":
        inputs["logits"] = (rng.standard_normal((b, t, v)) * 2.0).astype(dt)
    else:
        inputs["hidden"] = (rng.integers(-16, 17, (b, t, h)) / 8.0).astype(dt)
        inputs["lm_head"] = (rng.integers(-8, 9, (h, v)) / 32.0).astype(dt)
    ids = rng.integers(0, v, (b, t)).astype(np.int32)
    ids[0, 0], ids[-1, -1] = 0, v - 1  # both vocab edges
    inputs["chosen_ids"] = ids
    z = logits_of(inputs, problem.level)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    logp = np.take_along_axis(z, ids[..., None].astype(np.int64), -1)[..., 0] - lse
    mask = make_mask(b, t)
    old = logp + rng.standard_normal((b, t)) * ratio_noise
    ref = logp + rng.standard_normal((b, t)) * 0.3
    old[mask == 0] = -80.0
    ref[mask == 0] = 80.0
    inputs["old_logp"] = old.astype(np.float32)
    inputs["ref_logp"] = ref.astype(np.float32)
    adv = rng.standard_normal(b).astype(np.float32)
    adv[0], adv[1 % b] = abs(adv[0]) + 0.1, -abs(adv[1 % b]) - 0.1
    inputs["advantages"] = adv
    inputs["mask"] = mask
    assert list(inputs) == [s.name for s in input_specs(problem)]
    return inputs


_JIT_CACHE: dict = {}


def run_impl(impl_id: str, problem: Problem, knobs: Knobs, inputs: dict, options=None) -> dict:
    """Run an implementation directly (jit on the default CPU backend) -> numpy outputs."""
    impl = get(impl_id)
    opts = impl.resolve_options(options or {})
    fn = jax.jit(impl.build(problem, knobs, opts))
    outs = fn(*inputs.values())
    names = [s.name for s in output_specs(problem)]
    return {n: np.asarray(o) for n, o in zip(names, outs)}


def compare(got: dict, want: dict, mask: np.ndarray, dtype: str) -> list[str]:
    """Differences beyond tolerance, as messages (empty list = agreement)."""
    tol = TOLERANCES[dtype]
    problems = []
    for name, ref in want.items():
        out = got[name]
        if not np.all(np.isfinite(out.astype(np.float64))):
            problems.append(f"{name}: non-finite values")
            continue
        a, w = out.astype(np.float64), np.asarray(ref, np.float64)
        if name in ("per_token_loss", "kl", "clipped"):  # compared where mask = 1 only
            a, w = a[mask > 0], w[mask > 0]
        if name == "clipped":
            if not np.array_equal(a, w):
                problems.append(f"clipped differs at {int(np.sum(a != w))} tokens")
            continue
        err = float(np.max(np.abs(a - w))) if a.size else 0.0
        if name in ("dlogits", "dhidden", "dlm_head"):
            scale = float(np.max(np.abs(w))) if w.size else 0.0
            limit = tol * scale + 1e-12
        else:  # f32 outputs: float32 arithmetic error only
            limit = F32_OUTPUT_TOL * max(1.0, float(np.max(np.abs(w))) if w.size else 0.0)
        if err > limit:
            problems.append(f"{name}: max abs err {err:.3g} > {limit:.3g}")
    return problems
