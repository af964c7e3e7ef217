"""``xla_chunked``: the fused LM-head loss in plain XLA, over token x vocab chunks.

The [B, T, V] logits are never held whole: only one [chunk_tokens, chunk_vocab] tile of
``hidden @ lm_head`` (f32 accumulation) exists at a time, in both passes, and the
backward recomputes the tiles instead of saving them (``jax.custom_vjp``).

Forward (``lax.scan`` over token chunks, inside it over vocab chunks): per token the
running max ``m``, ``l = sum exp(s - m)``, ``a = sum exp(s - m) * (s - m)`` and the chosen
logit, with ``s = round?(z) / tau`` (``round?`` = rounding to the input dtype when
``logits_dtype == "input"``); then ``lse = m + log l``, ``logp = c - lse``,
``entropy = log l - a / l`` -- the same online formulas as the Pallas kernels.

Backward, with ``g = d loss / d logp`` from JAX autodiff of ``grpo_math``: the *vocab*
chunks are the outer loop, so that each chunk's ``dlm_head[:, chunk]`` is summed over all
tokens in an f32 [H, chunk_vocab] accumulator and written once (a whole f32 [H, V]
accumulator would double the output's memory for bf16 inputs); inside it, over token
chunks, ``dz = g * (onehot - exp(s - lse)) / tau`` for the tile, ``dW_chunk += h^T dz``
and ``dhidden += dz W_chunk^T`` (an f32 [N, H] accumulator, N = B*T, small next to V).

Layout: XLA:TPU stores an [H, V] LM head [V][H] when that pads less (bf16 [4096, 151643]:
V rounds up to 151648 rows rather than 151680 lanes). A loop carry is row-major, so the
[H, V] dlm_head accumulator would then be copied into the result (measured: peak 1.60x
the floor instead of 1.12x at (1, 8192, 4096, 151643) bf16, v6e). The implementation then
works on ``lm_head.T`` and accumulates ``dlm_head.T`` (option ``lm_head_layout``; auto =
``tpu_layout.tpu_default_order`` on tpu, "hv" elsewhere); both transposes are bitcasts.

Chunk counts need not divide the sizes: the whole chunks run in a scan and the remainder
(a static, smaller chunk) runs once after it, so nothing is padded or copied.

``impl_options``:
  chunk_tokens     1024   tokens per chunk (clamped to N = B*T)
  chunk_vocab      8192   vocab entries per chunk (clamped to V)
  lm_head_layout   null   "hv" | "vh" (vocab major) | null (auto, see Layout)
  matmul_precision "highest" | "default": ``lax.Precision`` of the f32 matmuls (TPU runs
                   f32 matmuls as one bf16 pass under "default")
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from ..spec import Knobs, Problem, RequestError
from . import grpo_math
from .baseline import round_to
from .interface import Capabilities, Implementation
from .tpu_layout import tpu_default_order

f32 = jnp.float32
_M_INIT = -1e30  # finite initial max: (m_old - m_new) * l_old is then 0, never -inf * 0


def _pieces(n: int, chunk: int):
    """[(start, size, count)]: ``count`` whole chunks of ``size`` from ``start``, then the
    remainder (if any) as one chunk."""
    chunk = min(chunk, n)
    whole = n // chunk
    out = [(0, chunk, whole)]
    if n % chunk:
        out.append((whole * chunk, n % chunk, 1))
    return out


def _loop(pieces, body, carry):
    """Runs ``carry = body(carry, start, size)`` over every chunk of ``pieces``."""
    for start, size, count in pieces:
        if count == 1:
            carry = body(carry, start, size)
        else:
            def step(c, i, start=start, size=size):
                return body(c, start + i * size, size), None
            carry, _ = jax.lax.scan(step, carry, jnp.arange(count))
    return carry


def make_logp_entropy(*, n, v, dtype, temperature, logits_dtype, chunk_tokens, chunk_vocab,
                      precision, vocab_major, dynamic_valid=False):
    """(hidden2 [N, H], w, ids [N], valid) -> (logp [N], entropy [N], lse [N]) with SPEC's
    VJP in logp and lse's own (entropy carries no gradient). ``w`` is lm_head [H, V], or its transpose [V, H] when
    ``vocab_major`` (the LM head's physical order on TPU for some V: see Layout)."""
    tok_pieces = _pieces(n, chunk_tokens)
    voc_pieces = _pieces(v, chunk_vocab)
    tau = temperature
    vax = 0 if vocab_major else 1  # the vocab axis of w
    # z = h @ w_chunk, contracting H: w's axis 0 ([H, Vc]) or 1 ([Vc, H]).
    dims = (((1,), (1 - vax,)), ((), ()))

    def scaled(h, w):
        z = jax.lax.dot_general(h.astype(w.dtype), w, dims, preferred_element_type=f32, precision=precision)
        if logits_dtype == "input":
            z = round_to(z, dtype)
        return z / tau

    def forward(hidden, lm_head, ids, valid):
        def token_chunk(outs, t0, tn):
            h = jax.lax.dynamic_slice_in_dim(hidden, t0, tn, 0)
            y = jax.lax.dynamic_slice_in_dim(ids, t0, tn, 0)

            def vocab_chunk(st, v0, vn):
                m_old, l_old, a_old, c_old = st
                w = jax.lax.dynamic_slice_in_dim(lm_head, v0, vn, vax)
                s = scaled(h, w)
                col = v0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
                if valid is not None:  # columns >= valid are padding (vocab-parallel shard)
                    s = jnp.where(col < valid, s, -jnp.inf)
                m_new = jnp.maximum(m_old, jnp.max(s, axis=1))
                alpha = jnp.exp(m_old - m_new)
                d = s - m_new[:, None]
                e = jnp.exp(d)
                ed = jnp.where(e > 0, e * d, 0.0)
                l_new = alpha * l_old + jnp.sum(e, axis=1)
                a_new = alpha * (a_old + (m_old - m_new) * l_old) + jnp.sum(ed, axis=1)
                c_new = c_old + jnp.sum(jnp.where(col == y[:, None], s, 0.0), axis=1)
                return m_new, l_new, a_new, c_new

            init = (jnp.full((tn,), _M_INIT, f32), jnp.zeros((tn,), f32),
                    jnp.zeros((tn,), f32), jnp.zeros((tn,), f32))
            m, l, a, c = _loop(voc_pieces, vocab_chunk, init)
            log_l = jnp.log(l)
            lse = m + log_l
            new = (lse, c - lse, log_l - a / l)
            return tuple(jax.lax.dynamic_update_slice_in_dim(o, x, t0, 0)
                         for o, x in zip(outs, new))

        zeros = jnp.zeros((n,), f32)
        return _loop(tok_pieces, token_chunk, (zeros, zeros, zeros))

    @jax.custom_vjp
    def logp_entropy(hidden, lm_head, ids, valid):
        lse, logp, ent = forward(hidden, lm_head, ids, valid)
        return logp, ent, lse

    def fwd_rule(hidden, lm_head, ids, valid):
        lse, logp, ent = forward(hidden, lm_head, ids, valid)
        return (logp, ent, lse), (hidden, lm_head, ids, valid, lse)

    def bwd_rule(res, cts):
        hidden, lm_head, ids, valid, lse = res
        g = cts[0].astype(f32)  # entropy's cotangent is ignored (a metric)
        gp = g - cts[2].astype(f32)  # softmax's coefficient: lse's cotangent enters here
        hdim = hidden.shape[1]

        def vocab_chunk(carry, v0, vn):
            dh, dw = carry
            w = jax.lax.dynamic_slice_in_dim(lm_head, v0, vn, vax)

            def token_chunk(inner, t0, tn):
                dh, dwc = inner
                h = jax.lax.dynamic_slice_in_dim(hidden, t0, tn, 0)
                y = jax.lax.dynamic_slice_in_dim(ids, t0, tn, 0)
                lse_c = jax.lax.dynamic_slice_in_dim(lse, t0, tn, 0)
                g_c = jax.lax.dynamic_slice_in_dim(g, t0, tn, 0)
                gp_c = jax.lax.dynamic_slice_in_dim(gp, t0, tn, 0)
                s = scaled(h, w)
                col = v0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
                onehot = (col == y[:, None]).astype(f32)
                dz = (g_c[:, None] * onehot - gp_c[:, None] * jnp.exp(s - lse_c[:, None])) / tau
                if valid is not None:  # padding columns: no gradient (and w may be 0 there)
                    dz = jnp.where(col < valid, dz, 0.0)
                hf, wf = h.astype(f32), w.astype(f32)
                if vocab_major:   # dW^T chunk [Vc, H] += dz^T h;  dh += dz @ w
                    dwc = dwc + jnp.dot(dz.T, hf, precision=precision)
                    part = jnp.dot(dz, wf, precision=precision)
                else:             # dW chunk [H, Vc] += h^T dz;    dh += dz @ w^T
                    dwc = dwc + jnp.dot(hf.T, dz, precision=precision)
                    part = jnp.dot(dz, wf.T, precision=precision)
                dh = jax.lax.dynamic_update_slice_in_dim(
                    dh, jax.lax.dynamic_slice_in_dim(dh, t0, tn, 0) + part, t0, 0)
                return dh, dwc

            acc = jnp.zeros((vn, hdim) if vocab_major else (hdim, vn), f32)
            dh, dwc = _loop(tok_pieces, token_chunk, (dh, acc))
            dw = jax.lax.dynamic_update_slice_in_dim(dw, dwc.astype(lm_head.dtype), v0, vax)
            return dh, dw

        dh0 = jnp.zeros((n, hdim), f32)
        dw0 = jnp.zeros(lm_head.shape, lm_head.dtype)
        dh, dw = _loop(voc_pieces, vocab_chunk, (dh0, dw0))
        return dh.astype(hidden.dtype), dw, None, None

    logp_entropy.defvjp(fwd_rule, bwd_rule)
    if dynamic_valid:
        return logp_entropy
    return lambda hidden, lm_head, ids: logp_entropy(hidden, lm_head, ids, None)


def _validate_options(options: Mapping[str, Any]) -> None:
    for key in ("chunk_tokens", "chunk_vocab"):
        val = options[key]
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise RequestError(f"impl_options.{key} must be a positive integer, got {val!r}")
    if options["lm_head_layout"] not in (None, "hv", "vh"):
        raise RequestError(f"impl_options.lm_head_layout must be null (auto), 'hv' or 'vh', "
                           f"got {options['lm_head_layout']!r}")
    if options["matmul_precision"] not in ("highest", "default"):
        raise RequestError(f"impl_options.matmul_precision must be 'highest' or 'default', "
                           f"got {options['matmul_precision']!r}")


def per_token(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """(hidden [B, T, H], lm_head [H, V], ids [B, T], valid_v=None, with_lse=False) ->
    (logp, entropy[, lse]) [B, T]; columns >= valid_v (a traced count) are padding; lse
    (the row's logsumexp) is differentiable too when asked for."""
    if problem.level != "fused":
        raise ValueError("xla_chunked implements the fused level only")
    _validate_options(options)
    b, t, h, v = problem.b, problem.t, problem.h, problem.v
    n = b * t
    precision = (jax.lax.Precision.HIGHEST if options["matmul_precision"] == "highest"
                 else jax.lax.Precision.DEFAULT)
    order = options["lm_head_layout"] or (
        "".join("hv"[i] for i in tpu_default_order((h, v), problem.dtype))
        if problem.platform == "tpu" else "hv")
    vocab_major = order == "vh"
    kernel = make_logp_entropy(
        n=n, v=v, dtype=jnp.dtype({"f32": f32, "bf16": jnp.bfloat16,
                                   "f16": jnp.float16}[problem.dtype]),
        temperature=k.temperature, logits_dtype=k.logits_dtype,
        chunk_tokens=options["chunk_tokens"], chunk_vocab=options["chunk_vocab"],
        precision=precision, vocab_major=vocab_major, dynamic_valid=True)

    def f(hidden, lm_head, chosen_ids, valid_v=None, with_lse=False):
        # lm_head.T is a bitcast when [V][H] is its physical order (no copy).
        w = lm_head.T if vocab_major else lm_head
        logp, ent, lse = kernel(hidden.reshape(n, h), w,
                                chosen_ids.reshape(n).astype(jnp.int32), valid_v)
        out = (logp.reshape(b, t), jax.lax.stop_gradient(ent.reshape(b, t)))
        return out + (lse.reshape(b, t),) if with_lse else out
    return f


def build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """All SPEC inputs in order -> (loss, metrics..., dhidden, dlm_head)."""
    return grpo_math.spec_function(per_token(problem, k, options), k, nhead=2)


IMPLEMENTATION = Implementation(
    id="xla_chunked",
    description="fused LM head in plain XLA: token x vocab chunks (lax.scan), online "
                "logsumexp; custom_vjp recomputes each logits tile, vocab-outer backward",
    build=build,
    capabilities=Capabilities(levels=frozenset({"fused"})),
    default_options={"chunk_tokens": 1024, "chunk_vocab": 8192, "matmul_precision": "highest",
                     "lm_head_layout": None},
    extra_check=lambda p, k, o: _validate_options(o),
    validate_options=_validate_options,
    per_token=per_token,
    # matmul_precision "default" trades the f32 matmuls' precision for speed, declared:
    # on CPU those matmuls are then computed as a TPU would (operands rounded to bf16).
    reduced_precision=lambda o: (None if o["matmul_precision"] == "highest"
                                 else f"matmul_precision: {o['matmul_precision']}"),
    # Few: libtpu takes minutes per compile of these loops at the seeds' shape.
    search_space={"chunk_tokens": (512, 2048), "chunk_vocab": (4096, 16384)},
)
