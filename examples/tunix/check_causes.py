#!/usr/bin/env python3
"""Each cause of tunix's failures, checked by hand: numpy on a case exported with
`grpo-suite inputs CASE --out DIR`, predicting the figure the suite measured from the
cause alone (tunix's rule, written out in numpy) against the oracle's outputs in DIR.

    .venv/bin/python examples/tunix/check_causes.py CAUSE DIR

CAUSE is one of the causes docs/external.md lists for tunix 0.1.7:

  zero_rows     aggregate_loss divides grpo's and dr_grpo's sum by the non-empty rows, not B
  masked_kl     k3 KL of a masked token's hostile ref_logp is inf, and inf · mask 0 is NaN
  ratio_clip    the log-ratio is clipped to [-20, 20]: no gradient past it, half on it
  ties          jnp.maximum / jnp.minimum send half the gradient each way at a clip edge
  temperature   logits /= τ in the logits' dtype (bf16) before the f32 log-softmax
  entropy       compute_entropy_from_logits works in the logits' dtype (bf16)
  bf16_grad     selective_log_softmax's two cotangents reach bf16 logits rounded apart

It prints one line: the predicted figure and what to compare it with (the `‖got − want‖`
or `rel` of the trial's FAIL line). Nothing here imports tunix or the suite's Rust.
"""
import json
import pathlib
import sys

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


def load(d, name):
    return np.load(d / f"{name}.npy")


def case_of(d):
    return json.loads((d / "case.json").read_text())["case"]


def log_softmax(z):
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def spec_terms(d, logp):
    """Per token: ratio r, advantage a, and the SPEC weight of each token (aggregation)."""
    c = case_of(d)
    k = c["knobs"]
    old, adv, mask = load(d, "old_logp").astype(np.float64), load(d, "advantages"), load(d, "mask")
    r = np.exp(np.where(mask > 0, logp - old, 0.0))
    return k, r, adv[:, None].astype(np.float64), mask


def zero_rows(d):
    mask = load(d, "mask")
    b = mask.shape[0]
    nz = int((mask.sum(-1) > 0).sum())
    loss = float(load(d, "loss"))
    # sequence-mean-token-mean: Σ_rows mean / non_zero_rows = SPEC's mean over B × B / nz.
    got = loss * b / nz
    print(f"zero_rows: B = {b}, non-empty rows {nz}: tunix's loss {got:.7e} against SPEC's "
          f"{loss:.7e}: |Δ| = {abs(got - loss):.3e}, rel {abs(got - loss) / abs(loss):.3f} "
          f"(compare the loss FAIL's ‖got − want‖ and rel; the gradient scales by the same {b / nz:g})")


def masked_kl(d):
    mask = load(d, "mask")
    ref = load(d, "ref_logp").astype(np.float32)
    logp = load(d, "per_token_logp").astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = ref - logp
        kl = np.exp(diff) - diff - np.float32(1)   # common.compute_kl_divergence, low_var_kl
        summed = (kl * mask).sum()                 # common.aggregate_loss
    bad = int((~np.isfinite(kl) & (mask == 0)).sum())
    print(f"masked_kl: {bad} masked token(s) with a non-finite KL (ref_logp up to "
          f"{np.abs(ref[mask == 0]).max():.0e}); Σ kl·mask = {summed} (compare the loss FAIL: "
          f"non-finite value NaN)")


def ratio_clip(d):
    c = case_of(d)
    mask = load(d, "mask")
    logp = load(d, "per_token_logp").astype(np.float32)
    old = load(d, "old_logp").astype(np.float32)
    lr = (logp - old)[mask > 0]
    dl = load(d, "dlogits").astype(np.float64)
    rows = dl.reshape(-1, dl.shape[-1])[mask.reshape(-1) > 0]
    past = np.abs(lr) > 20
    on = np.abs(lr) == 20
    # Past the clip the token's gradient is gone; on it, jnp.clip's tie keeps half.
    delta = np.sqrt((rows[past] ** 2).sum() + ((0.5 * rows[on]) ** 2).sum())
    print(f"ratio_clip: {int(past.sum())} token(s) past |log r| = 20 and {int(on.sum())} on it "
          f"(f32 log-ratios of the oracle's logp): predicted ‖Δ dlogits‖ {delta:.3e}, rel "
          f"{delta / np.sqrt((dl ** 2).sum()):.3f} (compare the dlogits FAIL)"
          f"{'' if c['knobs']['temperature'] == 1 else ' (τ ≠ 1: scale by 1/τ)'}")


def ties(d):
    k, r, a, mask = spec_terms(d, load(d, "per_token_logp").astype(np.float64))
    lo, hi = np.float32(1 - k["epsilon_low"]), np.float32(1 + k["epsilon_high"])
    # The f32 ratio tunix computes: exp(f32 logp − f32 old) in f32.
    logp32 = load(d, "per_token_logp").astype(np.float32)
    r32 = np.exp(np.where(mask > 0, logp32 - load(d, "old_logp").astype(np.float32),
                          np.float32(0))).astype(np.float32)
    # On an edge, jnp.clip's min/max tie passes half the gradient to the clipped term, and
    # jnp.maximum(pg_loss_1, pg_loss_2) of two equal terms takes half of each: 3/4 of
    # SPEC's −A·r (ties go to the unclipped branch whole), whichever the advantage's sign.
    # Whether tunix's f32 ratio is exactly the edge depends on the last bits of its own
    # logp and exp, which numpy does not reproduce: every token within 4 ulps of an edge
    # (the ratio_edges profile puts ratios on the edges in f64) is a candidate.
    ulp = lambda e: np.spacing(e)  # noqa: E731
    near = lambda e: np.abs(r32 - e) <= 4 * ulp(e)  # noqa: E731
    tie = (mask > 0) & (near(lo) | near(hi))
    # Per candidate: the SPEC gradient w.r.t. its logp is g = w·(−A·r + β·(1 − e^(ref−logp)))
    # (grpo weight w = 1/(B·n_b)); tunix keeps 3/4 of the −A·r share, all of the KL's, so
    # every element of the token's dlogits row comes out (¾·pg + kl)/(pg + kl) of SPEC's.
    ref = load(d, "ref_logp").astype(np.float64)
    logp = load(d, "per_token_logp").astype(np.float64)
    for b_, t_ in zip(*np.nonzero(tie)):
        pg = -a[b_, 0] * r[b_, t_]
        kl = k["beta"] * (1 - np.exp(ref[b_, t_] - logp[b_, t_]))
        print(f"ties: token [{b_}, {t_}] (A = {a[b_, 0]:+.3g}, f32 ratio {r32[b_, t_]!r}, within 4 "
              f"ulps of a clip edge): if tunix's ratio is the edge, its dlogits row is "
              f"{(0.75 * pg + kl) / (pg + kl):.4f} of SPEC's (compare the dlogits FAIL's worst "
              f"element, got/want)")


def temperature(d):
    c = case_of(d)
    tau = c["knobs"]["temperature"]
    z = load(d, "logits").astype(BF16)
    ids = load(d, "chosen_ids")
    scaled = (z / BF16(tau)).astype(BF16).astype(np.float64)  # logits /= τ, in bf16
    lp = np.take_along_axis(log_softmax(scaled), ids[..., None].astype(np.int64), -1)[..., 0]
    want = load(d, "per_token_logp").astype(np.float64)
    print(f"temperature: z/τ rounded to bf16 before the log-softmax: predicted "
          f"‖Δ per_token_logp‖ {np.linalg.norm(lp - want):.3e} (compare the per_token_logp FAIL)")


def entropy(d):
    r16 = lambda x: np.asarray(x, np.float32).astype(BF16).astype(np.float64)  # noqa: E731

    def softmax_parts(x):
        """jax.nn's max shift, exp, sum and log, each result rounded to bf16."""
        shifted = r16(x - x.max(-1, keepdims=True))
        e = r16(np.exp(shifted))
        total = r16(e.sum(-1, keepdims=True))
        return shifted, e, total

    z = r16(load(d, "logits"))
    tau = case_of(d)["knobs"]["temperature"]
    if tau != 1:
        z = r16(z / tau)                                     # logits /= temperature
    shifted, _, total = softmax_parts(z)
    log_probs = r16(shifted - r16(np.log(total)))           # jax.nn.log_softmax(logits)
    _, e, total = softmax_parts(log_probs)
    probs = r16(e / total)                                   # jax.nn.softmax(log_probs)
    ent = r16(-r16(probs * log_probs).sum(-1))               # -jnp.sum(probs * log_probs)
    want = load(d, "entropy").astype(np.float64)
    err = np.linalg.norm(ent - want)
    print(f"entropy: every step in bf16, predicted ‖Δ entropy‖ {err:.3e}, rel "
          f"{err / np.linalg.norm(want):.2e} (compare the entropy FAIL; the order of XLA's "
          f"bf16 sums is not reproduced, so the same order of magnitude, not the same digits)")


def bf16_grad(d):
    c = case_of(d)
    z = load(d, "logits").astype(np.float64)
    ids = load(d, "chosen_ids").astype(np.int64)
    p = np.exp(log_softmax(z / c["knobs"]["temperature"]))
    dl = load(d, "dlogits").astype(np.float64)
    b, t, v = dl.shape
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, ids[..., None], 1.0, -1)
    # dlogits = g·(onehot − p): recover g from the chosen column.
    py = np.take_along_axis(p, ids[..., None], -1)[..., 0]
    g = np.take_along_axis(dl, ids[..., None], -1)[..., 0] / np.where(py < 1, 1 - py, 1)
    # Two cotangents, each rounded to bf16 (the transposes of the two .astype(f32) in
    # selective_log_softmax), then added in bf16.
    a = (g[..., None] * onehot).astype(np.float32).astype(BF16)
    s = (-g[..., None] * p).astype(np.float32).astype(BF16)
    tunix = (a + s).astype(BF16).astype(np.float64)
    spec = (g[..., None] * (onehot - p)).astype(np.float32).astype(BF16).astype(np.float64)
    err = np.linalg.norm(tunix - dl)
    print(f"bf16_grad: predicted ‖Δ dlogits‖ {err:.3e} (one rounding of the SPEC gradient: "
          f"{np.linalg.norm(spec - dl):.3e}); chosen tokens' p up to {py.max():.2f} "
          f"(compare the dlogits FAIL)")


CAUSES = {f.__name__: f for f in (zero_rows, masked_kl, ratio_clip, ties, temperature, entropy,
                                  bf16_grad)}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in CAUSES:
        print(f"usage: check_causes.py {{{'|'.join(CAUSES)}}} DIR", file=sys.stderr)
        sys.exit(2)
    CAUSES[sys.argv[1]](pathlib.Path(sys.argv[2]))
