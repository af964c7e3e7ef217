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
When N does not divide V (151643 on 4 or 8, 2049 on 4) the module takes and returns the
[.., V] arrays padded to a multiple of N (``module_problem``), so every chip holds only
its shard: the caller fills padded logits with ``pad_value`` (probability exactly 0) and
padded LM-head columns with 0, which the core's ``valid_v`` excludes (a zero column would
give logit 0 and count in the normaliser: a known bug class); padded gradient columns
come back 0 and are cut off (``crop_outputs``; the Rust worker checks they are 0).
Per shard k the core is called with every chosen id set to −1, which selects no column
(the ``per_token`` contract): it returns −lse_k and the shard's entropy, and its VJP is
exactly d lse_k / dz = softmax_k / τ (no cancellation of two large terms, which in bf16
cost more than the tolerance when it was tried with a real column and s_0 − logp_0); the
chosen logit is read from the shard that owns it. Across shards: lse = logsumexp_k lse_k
(max-shifted), logp = c − lse, entropy = Σ_k w_k (ent_k − log w_k) with
w_k = exp(lse_k − lse) (``vocab_fused.mixture_entropy``: no cancellation). Logits level: this runs outside shard_map on global arrays and
gradients flow through the core's own VJP. Fused level: ``vocab_fused`` (a custom VJP
that sums the dhidden partials across shards in f32, chunk by chunk).

Output shardings: loss and per-token outputs replicated; dlogits like logits; dhidden
sharded on B (batch) or replicated (vocab); dlm_head replicated (batch) or on V (vocab).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from ..spec import DTYPES, Knobs, Problem
from . import grpo_math, vocab_fused
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
    if impl.per_token is None and (sharding == "vocab" or impl.build_batch_sharded is None):
        if impl.build_batch_sharded is not None:
            return ("vocab sharding needs a per_token core (each shard's −logsumexp for the "
                    "vocab-parallel combine); this kernel runs batch-sharded only")
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


def specs(level: str, sharding: str, devices: int):
    """(input PartitionSpecs in SPEC order, output PartitionSpecs in SPEC order).

    With vocab sharding the [.., V] arrays are split on V; the module takes them padded
    to a multiple of the device count (``module_problem``), so the split is always even."""
    rep, row = P(), P(AXIS)
    if level == "logits":
        head_in = [row if sharding == "batch" else P(None, None, AXIS)]
        head_out = [head_in[0]]
    else:
        head_in = [row, rep] if sharding == "batch" else [rep, P(None, AXIS)]
        head_out = head_in
    tail = [row, row, row, row, row] if sharding == "batch" else [rep] * 5
    return head_in + tail, [rep] * 6 + head_out


def module_problem(problem: Problem, sharding: str, devices: int) -> Problem:
    """The problem whose SPEC shapes the module takes and returns: V padded up to a
    multiple of ``devices`` for vocab sharding (unchanged otherwise)."""
    if sharding == "vocab" and devices > 1:
        return dataclasses.replace(problem, v=padded_v(problem.v, devices))
    return problem


def pad_values(problem: Problem) -> dict:
    """What the caller writes into padded columns, per [.., V] input: logits get
    ``pad_value`` (probability exactly 0 after any temperature); LM-head columns get 0,
    which the core must exclude itself (``valid_v``: a zero column has logit 0 and would
    count in the normaliser, a known bug class)."""
    if problem.level == "logits":
        return {"logits": pad_value(DTYPES[problem.dtype])}
    return {"lm_head": 0.0}


def pad_inputs(problem: Problem, sharding: str, devices: int, arrays: Mapping[str, Any]) -> dict:
    """The module's inputs from SPEC-shaped ones (numpy): [.., V] arrays padded on their
    last axis with ``pad_values``. The harness does the same on its side (Rust worker)."""
    v_pad = module_problem(problem, sharding, devices).v
    out = dict(arrays)
    for name, value in pad_values(problem).items():
        if v_pad != problem.v:
            import numpy as np
            a = np.asarray(arrays[name])
            width = [(0, 0)] * (a.ndim - 1) + [(0, v_pad - problem.v)]
            out[name] = np.pad(a, width, constant_values=np.asarray(value, a.dtype))
    return out


def crop_outputs(problem: Problem, outputs: Mapping[str, Any]) -> dict:
    """SPEC-shaped outputs from the module's: [.., V] gradients cut back to V columns.
    Raises if a padded column got a nonzero gradient (padding leaked into the loss)."""
    import numpy as np
    out = dict(outputs)
    for name in ("dlogits", "dlm_head"):
        if name in out and np.shape(out[name])[-1] != problem.v:
            a = np.asarray(out[name])
            tail = a[..., problem.v:]
            if np.any(tail != 0):
                raise AssertionError(f"{name}: padded columns have nonzero gradient "
                                     f"(max |x| {float(np.max(np.abs(tail.astype(np.float32))))})")
            out[name] = a[..., :problem.v]
    return out


def shard_axis(spec: P) -> Optional[int]:
    """The array axis a PartitionSpec splits over the mesh (None: replicated)."""
    for i, s in enumerate(spec):
        if s == AXIS:
            return i
    return None


def build(impl: Implementation, problem: Problem, k: Knobs, options: Mapping[str, Any],
          devices: int, sharding: str, *, unsafe_local_normaliser: bool = False,
          unsafe_bf16_reduction: bool = False):
    """The case's function on ``devices`` devices (jit it with ``shardings``)."""
    m = mesh(devices)
    level, n = problem.level, devices
    nhead = 1 if level == "logits" else 2
    if impl.per_token is None:  # support_reason allowed batch sharding only
        assert sharding == "batch" and impl.build_batch_sharded is not None

        def batch_map(f, nargs, replicated=()):
            in_specs = tuple(P() if i in replicated else P(AXIS) for i in range(nargs))
            return jax.shard_map(f, mesh=m, in_specs=in_specs, out_specs=P(AXIS),
                                 check_vma=False)
        return impl.build_batch_sharded(problem, k, options, batch_map)
    v, v_pad = problem.v, padded_v(problem.v, n)
    if sharding == "batch":
        local = dataclasses.replace(problem, b=problem.b // n)
    else:
        local = dataclasses.replace(problem, v=v_pad // n)
    core = impl.per_token(local, k, options)
    # Inside: the (padded) head arrays split evenly on V.
    in_specs, _ = specs(level, sharding, n)

    if sharding == "batch":
        def per_token(*head_ids):
            return jax.shard_map(core, mesh=m, in_specs=tuple(in_specs[:nhead]) + (P(AXIS),),
                                 out_specs=(P(AXIS), P(AXIS)), check_vma=False)(*head_ids)
    elif level == "fused":
        per_token = vocab_fused.make(impl, problem, k, options, m, AXIS, n,
                                     unsafe_bf16_reduction=unsafe_bf16_reduction)
    else:
        v_l = v_pad // n

        def shard_stats(z, ids):
            off = jax.lax.axis_index(AXIS) * v_l
            y_l = ids - off
            own = (y_l >= 0) & (y_l < v_l)
            y_c = jnp.clip(y_l, 0, v_l - 1)
            neg_lse, ent = core(z, jnp.full_like(ids, -1))  # id -1: the core returns -lse_k
            s_y = jnp.take_along_axis(z, y_c[..., None], axis=-1)[..., 0].astype(f32)
            c_k = jnp.where(own, s_y / k.temperature, 0.0)
            return (-neg_lse)[None], jax.lax.stop_gradient(ent)[None], c_k[None]

        def per_token(z, ids):
            lse_k, ent_k, c_k = jax.shard_map(
                shard_stats, mesh=m, in_specs=(in_specs[0], P()),
                out_specs=(P(AXIS), P(AXIS), P(AXIS)), check_vma=False)(z, ids)
            top = jax.lax.stop_gradient(jnp.max(lse_k, axis=0))
            lse = top + jnp.log(jnp.sum(jnp.exp(lse_k - top), axis=0))
            logp = jnp.sum(c_k, axis=0) - lse
            entropy = jax.lax.stop_gradient(vocab_fused.mixture_entropy(lse_k, ent_k, lse))
            return logp, entropy

    loss_from_logp = None
    if unsafe_local_normaliser:  # test-only mutant: per-device normalisers, summed
        def loss_from_logp(logp, old_logp, ref_logp, advantages, mask, k_):
            return _local_normaliser_loss(logp, old_logp, ref_logp, advantages, mask, k_, n)
    return grpo_math.spec_function(per_token, k, nhead, loss_from_logp)


def shardings(problem: Problem, sharding: str, devices: int):
    """(in_shardings, out_shardings) for ``jax.jit``."""
    m = mesh(devices)
    ins, outs = specs(problem.level, sharding, devices)
    return (tuple(NamedSharding(m, s) for s in ins), tuple(NamedSharding(m, s) for s in outs))


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
