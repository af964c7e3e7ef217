"""Multi-device variants of any implementation with a ``per_token`` core, under
``jax.shard_map`` over a 1-D mesh ("d", N devices). Mosaic kernels are not
auto-partitionable (seed 000), so the kernel runs inside ``shard_map`` on each device's
shard; everything that mixes shards is plain jnp outside it, on global arrays, where
XLA's SPMD partitioner inserts the collectives and autodiff needs no rule for them.

``batch``: B split over devices; every input [B, ...] sharded on B, lm_head replicated.
The per-token core runs per shard; the GRPO terms and the aggregation run on the global
[B, T] arrays, so every normaliser is global (grpo's mean over rows, bnpo's mask total,
dr_grpo's B·L). Needs B % N == 0.

``vocab``: logits (logits level) or lm_head (fused level) split over V, Megatron style.
V is padded up to a multiple of N when it does not divide (151643 on 4 or 8, 2049 on 4):
padded logits get ``pad_value`` (probability exactly 0), padded LM-head columns are
excluded by the core's ``valid_v`` (a zero column would give logit 0 and count in the
normaliser: a known bug class). Per shard k the core is called with every chosen id set
to −1, which selects no column (the ``per_token`` contract): it returns −lse_k and the
shard's entropy, and its VJP is exactly d lse_k / dz = softmax_k / τ (no cancellation of
two large terms, which in bf16 cost more than the tolerance when it was tried with a real
column and s_0 − logp_0); the chosen logit is read from the shard that owns it. Across shards (outside shard_map):
lse = logsumexp_k lse_k (max-shifted), logp = c − lse, entropy = lse − Σ_k w_k (lse_k −
ent_k) with w_k = exp(lse_k − lse). Gradients flow through the core's own VJP:
d lse_k / dz = softmax_k(z) / τ, so dlogits / dlm_head come out sharded like the inputs.

Output shardings: loss and per-token outputs replicated; dlogits like logits; dhidden
sharded on B (batch) or replicated (vocab); dlm_head replicated (batch) or on V (vocab).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from ..spec import Knobs, Problem
from . import grpo_math
from .baseline import pad_value
from .interface import Implementation

f32 = jnp.float32
SHARDINGS = ("batch", "vocab")
AXIS = "d"


def padded_v(v: int, n: int) -> int:
    return -(-v // n) * n


def support_reason(impl: Implementation, p: Problem, devices: int, sharding: str) -> Optional[str]:
    """None if the implementation can run sharded this way, else why not."""
    if devices == 1:
        return None
    if impl.per_token is None:
        return (f"runs on one device only (no per_token core for the {sharding}-sharded "
                f"wrapper)")
    if sharding == "batch" and p.b % devices:
        return f"B={p.b} is not divisible by {devices} devices (batch sharding)"
    if sharding == "vocab" and padded_v(p.v, devices) - p.v >= p.v // devices:
        return f"V={p.v} is too small for {devices} vocab shards"
    return None


def mesh(devices: int):
    have = jax.devices()
    if len(have) < devices:
        raise RuntimeError(f"the exporter has {len(have)} devices, the case needs {devices} "
                           f"(XLA_FLAGS=--xla_force_host_platform_device_count)")
    return jax.make_mesh((devices,), (AXIS,), axis_types=(AxisType.Auto,),
                         devices=have[:devices])


def specs(level: str, sharding: str, v: int, devices: int):
    """(input PartitionSpecs in SPEC order, output PartitionSpecs in SPEC order).

    A module's entry arrays can only be split evenly: with vocab sharding and V % N != 0
    the [.., V] inputs and outputs are replicated at the module boundary (every device
    holds them whole; inside, they are padded and each device computes on its shard)."""
    rep, row = P(), P(AXIS)
    even = v % devices == 0
    if level == "logits":
        head_in = [row if sharding == "batch" else (P(None, None, AXIS) if even else rep)]
        head_out = [head_in[0]]
    else:
        head_in = ([row, rep] if sharding == "batch" else [rep, P(None, AXIS) if even else rep])
        head_out = head_in
    tail = [row, row, row, row, row] if sharding == "batch" else [rep] * 5
    return head_in + tail, [rep] * 6 + head_out


def shard_axis(spec: P) -> Optional[int]:
    """The array axis a PartitionSpec splits over the mesh (None: replicated)."""
    for i, s in enumerate(spec):
        if s == AXIS:
            return i
    return None


def build(impl: Implementation, problem: Problem, k: Knobs, options: Mapping[str, Any],
          devices: int, sharding: str, *, unsafe_local_normaliser: bool = False):
    """The case's function on ``devices`` devices (jit it with ``shardings``)."""
    m = mesh(devices)
    level, n = problem.level, devices
    nhead = 1 if level == "logits" else 2
    v, v_pad = problem.v, padded_v(problem.v, n)
    if sharding == "batch":
        local = dataclasses.replace(problem, b=problem.b // n)
    else:
        local = dataclasses.replace(problem, v=v_pad // n)
    core = impl.per_token(local, k, options)
    # Inside: the (padded) head arrays split evenly on V.
    in_specs, _ = specs(level, sharding, v_pad, n)

    if sharding == "batch":
        def per_token(*head_ids):
            return jax.shard_map(core, mesh=m, in_specs=tuple(in_specs[:nhead]) + (P(AXIS),),
                                 out_specs=(P(AXIS), P(AXIS)), check_vma=False)(*head_ids)
    else:
        v_l = v_pad // n

        def shard_stats(*args):
            *head, ids = args
            off = jax.lax.axis_index(AXIS) * v_l
            y_l = ids - off
            own = (y_l >= 0) & (y_l < v_l)
            y_c = jnp.clip(y_l, 0, v_l - 1)
            none = jnp.full_like(ids, -1)  # selects no column: the core returns -lse_k
            if level == "logits":
                (z,) = head
                neg_lse, ent = core(z, none)
                s_y = jnp.take_along_axis(z, y_c[..., None], axis=-1)[..., 0].astype(f32)
                s_y = s_y / k.temperature
            else:
                hidden32, w = head
                hidden = hidden32.astype(w.dtype)  # the kernel's dtype; see per_token below
                valid = jnp.clip(v - off, 0, v_l).astype(jnp.int32)
                neg_lse, ent = core(hidden, w, none, valid)
                w_y = jnp.take(w, y_c, axis=1)                      # [H, B, T]
                s_y = _fused_logit(hidden32, jnp.moveaxis(w_y, 0, -1), k, problem)
            lse_k = -neg_lse
            c_k = jnp.where(own, s_y, 0.0)
            return lse_k[None], jax.lax.stop_gradient(ent)[None], c_k[None]

        def per_token(*head_ids):
            *head, ids = head_ids
            if level == "logits" and v_pad != v:
                head = [jnp.pad(head[0], ((0, 0), (0, 0), (0, v_pad - v)),
                                constant_values=pad_value(head[0].dtype))]
            elif level == "fused":
                # hidden enters the shards in f32 so that the per-shard dhidden partials
                # (each rounded once to the input dtype by the core) are summed across
                # shards in f32, not in bf16 (measured: 8 shards summed in bf16 exceeded
                # the bf16 tolerance on dhidden by 4%).
                w = head[1] if v_pad == v else jnp.pad(head[1], ((0, 0), (0, v_pad - v)))
                head = [head[0].astype(f32), w]
            lse_k, ent_k, c_k = jax.shard_map(
                shard_stats, mesh=m,
                in_specs=tuple(in_specs[:nhead]) + (P(),),
                out_specs=(P(AXIS), P(AXIS), P(AXIS)), check_vma=False)(*head, ids)
            top = jax.lax.stop_gradient(jnp.max(lse_k, axis=0))
            lse = top + jnp.log(jnp.sum(jnp.exp(lse_k - top), axis=0))
            logp = jnp.sum(c_k, axis=0) - lse
            wk = jax.lax.stop_gradient(jnp.exp(lse_k - lse))
            entropy = jax.lax.stop_gradient(lse - jnp.sum(wk * (lse_k - ent_k), axis=0))
            return logp, entropy

    loss_from_logp = None
    if unsafe_local_normaliser:  # test-only mutant: per-device normalisers, summed
        def loss_from_logp(logp, old_logp, ref_logp, advantages, mask, k_):
            return _local_normaliser_loss(logp, old_logp, ref_logp, advantages, mask, k_, n)
    return grpo_math.spec_function(per_token, k, nhead, loss_from_logp)


def shardings(problem: Problem, sharding: str, devices: int):
    """(in_shardings, out_shardings) for ``jax.jit``."""
    m = mesh(devices)
    ins, outs = specs(problem.level, sharding, problem.v, devices)
    return (tuple(NamedSharding(m, s) for s in ins), tuple(NamedSharding(m, s) for s in outs))


def _fused_logit(hidden, w_cols, k: Knobs, problem: Problem):
    """s = round?(hidden · w) / τ with one LM-head column per token ([B, T, H] · [B, T, H])."""
    z = jnp.einsum("bth,bth->bt", hidden.astype(f32), w_cols.astype(f32),
                   precision=jax.lax.Precision.HIGHEST)
    if k.logits_dtype == "input" and problem.dtype != "f32":
        from .baseline import round_to
        z = round_to(z, w_cols.dtype)
    return z / k.temperature


def _local_normaliser_loss(logp, old_logp, ref_logp, advantages, mask, k, n):
    """The wrong variant: each device aggregates its B/N rows with its own normaliser and
    the per-device losses are summed (what a psum of local losses gives)."""
    b = logp.shape[0]
    parts, auxes = [], []
    for i in range(n):
        sl = slice(i * b // n, (i + 1) * b // n)
        li, ai = grpo_math.grpo_from_logp(logp[sl], old_logp[sl], ref_logp[sl],
                                          advantages[sl], mask[sl], k)
        parts.append(li)
        auxes.append(ai)
    aux = {key: jnp.concatenate([a[key] for a in auxes]) for key in auxes[0]}
    return sum(parts), aux
