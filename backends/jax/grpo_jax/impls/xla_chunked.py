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

The loops may take the LM head's vocab chunks from a Pallas DMA instead of a dynamic
slice (``lm_head_fetch: pallas``, module ``lm_head_fetch``): on tpu7x a sliced loop carry
makes XLA re-tile the whole bf16 head first, one more H·V buffer.

``impl_options``:
  chunk_tokens     1024   tokens per chunk (clamped to N = B*T)
  chunk_vocab      8192   vocab entries per chunk (clamped to V)
  lm_head_layout   null   "hv" | "vh" (vocab major) | null (auto, see Layout)
  lm_head_fetch    null   "slice" (null) | "pallas": the vocab chunks from a DMA kernel
                          (Pallas' interpreter off TPU). A tpu7x option: there it saves the
                          re-tiled head; on v6e it costs HBM time (docs/implementations.md)
  matmul_precision "highest" | "default": ``lax.Precision`` of the f32 matmuls (TPU runs
                   f32 matmuls as one bf16 pass under "default")
  dz_precision     "f32" (one f32 matmul per backward product, at matmul_precision) |
                   "x3" | "x3_dlm_head" | "x2" | "x1": with a 16-bit LM head, dz enters the
                   (dhidden, dlm_head) products as (3, 3), (1, 3), (2, 2) or (1, 1)
                   single-pass 16-bit terms (``make_logp_entropy``'s dz_terms).
                   "x3_dlm_head" is the cheapest that keeps the Adam trajectory; "x1"
                   rounds dz once, jax_baseline's three matmuls, and fails it
                   (docs/implementations.md, "The time-memory front")
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from ..spec import Knobs, Problem, RequestError
from . import grpo_math
from .baseline import round_to
from . import lm_head_fetch
from .dz_terms import product_of_terms
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


def _grid(voc_pieces, tok_pieces, step, carry, tiles=None, begin=None, end=None,
          static_single=False):
    """Every (vocab chunk, token chunk) tile, vocab chunks outermost: a scan over each
    piece's vocab chunks whose body runs the token chunks one after another (unrolled, at
    static offsets): ``step(carry, v0, vn, t0, tn, tile_in) -> (carry, tile_out)``, with
    ``begin(carry, v0, vn)`` and ``end(carry, v0, vn)`` (optional) around each vocab
    chunk's token chunks. Returns (carry, tiles): per vocab piece, a tuple with each token
    chunk's tile_out stacked over the vocab chunks ([vocab count, tn, vn]); ``tiles`` (such
    a result of another call over the same pieces) gives each step its tile_in. A scan's
    stacked output and input are written and read in place, one tile a step: the tiles
    never form an [N, V] array, and no tile is copied (a nested scan's stack was: one
    more pass over the logits each way). ``static_single``: a piece of one vocab chunk
    runs without a scan, at a static offset (a traced one would be fetched, and a
    remainder piece's offset is no multiple of its size)."""
    starts = [(ts + i * tn, tn) for ts, tn, tc in tok_pieces for i in range(tc)]
    out = []
    for p, (vs, vn, vc) in enumerate(voc_pieces):
        def vstep(c, xs, vs=vs, vn=vn):
            vi, vin = xs
            v0 = vs + vi * vn
            if begin is not None:
                c = begin(c, v0, vn)
            ys = []
            for q, (t0, tn) in enumerate(starts):
                c, y = step(c, v0, vn, t0, tn, None if vin is None else vin[q])
                ys.append(y)
            if end is not None:
                c = end(c, v0, vn)
            return c, tuple(ys)
        if vc == 1 and static_single:
            carry, ys = vstep(carry, (0, None if tiles is None
                                      else tuple(t[0] for t in tiles[p])))
            ys = tuple(None if y is None else y[None] for y in ys)
        else:
            carry, ys = jax.lax.scan(vstep, carry,
                                     (jnp.arange(vc), None if tiles is None else tiles[p]))
        out.append(ys)
    return carry, out


def make_logp_entropy(*, n, v, dtype, temperature, logits_dtype, chunk_tokens, chunk_vocab,
                      precision, vocab_major, dynamic_valid=False, save_logits=False,
                      dz_terms=None, fetch="slice", interpret=False, _unsafe_lse_shift=0):
    """(hidden2 [N, H], w, ids [N], valid) -> (logp [N], entropy [N], lse [N]) with SPEC's
    VJP in logp and lse's own (entropy carries no gradient). ``w`` is lm_head [H, V], or
    its transpose [V, H] when
    ``vocab_major`` (the LM head's physical order on TPU for some V: see Layout).

    ``save_logits`` (xla_saved_logits): the forward also writes every tile, rounded to the
    logits' storage dtype (the input dtype for ``logits_dtype == "input"``, else f32), into
    one [N, V] array kept for the backward, which reads the tiles back instead of
    recomputing them: 3 logits-sized matmuls in all instead of 5. ``dz_terms`` (a 16-bit
    LM head only): for each backward product, dhidden's and dlm_head's, how many 16-bit
    terms dz enters as, t1 = round(dz), t2 = round(dz − t1), ..., each an exact-product
    single-pass matmul with the 16-bit operand summed in f32 (bf16 terms: 8 significant
    bits each, so 3 terms hold an f32 dz to about 24 bits); 1 is dz rounded to the input
    dtype; None: one matmul of f32 operands at ``precision`` (six bf16 passes on a TPU at
    HIGHEST). ``fetch`` "pallas": the loops take w's vocab chunks at traced offsets from
    ``lm_head_fetch.chunk`` (``interpret``: in Pallas' interpreter), "slice": by
    ``dynamic_slice``. ``_unsafe_lse_shift`` (a test aid: a
    deliberately wrong backward) takes each row's lse from the row that many places on."""
    tok_pieces = _pieces(n, chunk_tokens)
    voc_pieces = _pieces(v, chunk_vocab)
    tau = temperature
    vax = 0 if vocab_major else 1  # the vocab axis of w
    # z = h @ w_chunk, contracting H: w's axis 0 ([H, Vc]) or 1 ([Vc, H]).
    dims = (((1,), (1 - vax,)), ((), ()))

    def w_chunk(w, v0, vn):
        """w's vocab chunk [v0, v0 + vn). A scanned chunk's offset is traced; every scanned
        piece starts at 0 (``_pieces``), so v0 + vn <= V."""
        if fetch == "slice" or isinstance(v0, int):
            return jax.lax.dynamic_slice_in_dim(w, v0, vn, vax)
        return lm_head_fetch.chunk(w, v0, vn, vax, interpret=interpret)

    def logits(h, w):
        z = jax.lax.dot_general(h.astype(w.dtype), w, dims, preferred_element_type=f32, precision=precision)
        if logits_dtype == "input":
            z = round_to(z, dtype)
        return z

    def scaled(h, w):
        return logits(h, w) / tau

    narrow = jnp.dtype(dtype) != jnp.dtype(f32)

    def _product(dz, x, contract, swap=False, terms=None):
        """The f32 product of f32 ``dz`` and ``x`` (a tile of hidden or lm_head),
        contracting dz's axis ``contract[0]`` with x's ``contract[1]`` (``swap``: x's free
        axis first in the result), with dz as ``terms`` 16-bit terms (see dz_terms) or,
        for None or f32 inputs, one f32 matmul at ``precision``."""
        def dot(a, b):
            dims = (((contract[0],), (contract[1],)), ((), ()))
            if swap:
                dims = (((contract[1],), (contract[0],)), ((), ()))
                a, b = b, a
            return jax.lax.dot_general(a, b, dims, preferred_element_type=f32,
                                       precision=None if a.dtype != f32 else precision)
        if terms is None or not narrow:
            return dot(dz, x.astype(f32))
        x16 = x.astype(dtype)
        return product_of_terms(dz, dtype, terms, lambda term: dot(term, x16))

    store = dtype if logits_dtype == "input" else f32  # the saved logits' dtype

    def fold(st, z, v0, y, valid):
        """The running (m, l, a, c) of a token chunk after the logits tile ``z``."""
        m_old, l_old, a_old, c_old = st
        s = z / tau
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

    def finish(m, l, a, c):
        """(lse, logp, entropy) from the running statistics."""
        log_l = jnp.log(l)
        lse = m + log_l
        return lse, c - lse, log_l - a / l

    def init_stats(tn):
        return (jnp.full((tn,), _M_INIT, f32), jnp.zeros((tn,), f32),
                jnp.zeros((tn,), f32), jnp.zeros((tn,), f32))

    def forward(hidden, lm_head, ids, valid):
        """(lse, logp, entropy): token chunks outermost, the tiles recomputed."""
        def token_chunk(outs, t0, tn):
            h = jax.lax.dynamic_slice_in_dim(hidden, t0, tn, 0)
            y = jax.lax.dynamic_slice_in_dim(ids, t0, tn, 0)

            def vocab_chunk(st, v0, vn):
                w = w_chunk(lm_head, v0, vn)
                return fold(st, logits(h, w), v0, y, valid)

            new = finish(*_loop(voc_pieces, vocab_chunk, init_stats(tn)))
            return tuple(jax.lax.dynamic_update_slice_in_dim(o, x, t0, 0)
                         for o, x in zip(outs, new))

        zeros = jnp.zeros((n,), f32)
        return _loop(tok_pieces, token_chunk, (zeros, zeros, zeros))

    def forward_saving(hidden, lm_head, ids, valid):
        """(lse, logp, entropy) and every tile in ``store``: vocab chunks outermost, as the
        backward reads them (``_grid``), the running statistics of all N tokens carried."""
        def tile(st, v0, vn, t0, tn, _):
            h = jax.lax.dynamic_slice_in_dim(hidden, t0, tn, 0)
            y = jax.lax.dynamic_slice_in_dim(ids, t0, tn, 0)
            w = w_chunk(lm_head, v0, vn)
            z = logits(h, w)  # already of its stored precision
            part = fold(tuple(jax.lax.dynamic_slice_in_dim(x, t0, tn, 0) for x in st),
                        z, v0, y, valid)
            st = tuple(jax.lax.dynamic_update_slice_in_dim(x, u, t0, 0)
                       for x, u in zip(st, part))
            return st, z.astype(store)

        stats, tiles = _grid(voc_pieces, tok_pieces, tile, init_stats(n),
                             static_single=fetch == "pallas")
        return finish(*stats), tiles

    @jax.custom_vjp
    def logp_entropy(hidden, lm_head, ids, valid):
        lse, logp, ent = forward(hidden, lm_head, ids, valid)
        return logp, ent, lse

    def fwd_rule(hidden, lm_head, ids, valid):
        if save_logits:
            (lse, logp, ent), tiles = forward_saving(hidden, lm_head, ids, valid)
        else:
            (lse, logp, ent), tiles = forward(hidden, lm_head, ids, valid), None
        return (logp, ent, lse), (hidden, lm_head, ids, valid, lse, tiles)

    def bwd_rule(res, cts):
        hidden, lm_head, ids, valid, lse, tiles = res
        if _unsafe_lse_shift:
            lse = jnp.roll(lse, _unsafe_lse_shift)
        g = cts[0].astype(f32)  # entropy's cotangent is ignored (a metric)
        gp = g - cts[2].astype(f32)  # softmax's coefficient: lse's cotangent enters here
        hdim = hidden.shape[1]

        def tile_grads(dh, dwc, v0, vn, t0, tn, saved_tile):
            """dz of one tile, folded into the dhidden rows and the chunk's dW."""
            w = w_chunk(lm_head, v0, vn)
            h = jax.lax.dynamic_slice_in_dim(hidden, t0, tn, 0)
            y = jax.lax.dynamic_slice_in_dim(ids, t0, tn, 0)
            lse_c = jax.lax.dynamic_slice_in_dim(lse, t0, tn, 0)
            g_c = jax.lax.dynamic_slice_in_dim(g, t0, tn, 0)
            gp_c = jax.lax.dynamic_slice_in_dim(gp, t0, tn, 0)
            if saved_tile is not None:  # the forward's tile, read back: nothing recomputed
                s = saved_tile.astype(f32) / tau
            else:
                s = scaled(h, w)
            col = v0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            onehot = (col == y[:, None]).astype(f32)
            dz = (g_c[:, None] * onehot - gp_c[:, None] * jnp.exp(s - lse_c[:, None])) / tau
            if valid is not None:  # padding columns: no gradient (and w may be 0 there)
                dz = jnp.where(col < valid, dz, 0.0)
            dh_terms, dw_terms = dz_terms or (None, None)
            if vocab_major:   # dW^T chunk [Vc, H] += dz^T h;  dh += dz @ w
                dwc = dwc + _product(dz.T, h, (1, 0), terms=dw_terms)
                part = _product(dz, w, (1, 0), terms=dh_terms)
            else:             # dW chunk [H, Vc] += h^T dz;    dh += dz @ w^T
                dwc = dwc + _product(dz, h, (0, 0), swap=True, terms=dw_terms)
                part = _product(dz, w, (1, 1), terms=dh_terms)
            dh = jax.lax.dynamic_update_slice_in_dim(
                dh, jax.lax.dynamic_slice_in_dim(dh, t0, tn, 0) + part, t0, 0)
            return dh, dwc

        def acc(vn):
            return jnp.zeros((vn, hdim) if vocab_major else (hdim, vn), f32)

        def write(dw, dwc, v0):
            return jax.lax.dynamic_update_slice_in_dim(dw, dwc.astype(lm_head.dtype), v0, vax)

        dh0 = jnp.zeros((n, hdim), f32)
        dw0 = jnp.zeros(lm_head.shape, lm_head.dtype)
        if tiles is not None:
            def tile(c, v0, vn, t0, tn, saved_tile):
                dh, dw, dwc = c
                dh, dwc = tile_grads(dh, dwc, v0, vn, t0, tn, saved_tile)
                return (dh, dw, dwc), None

            (dh, dw), _ = _grid(voc_pieces, tok_pieces, tile, (dh0, dw0), tiles,
                                begin=lambda c, v0, vn: c + (acc(vn),),
                                end=lambda c, v0, vn: (c[0], write(c[1], c[2], v0)),
                                static_single=fetch == "pallas")
        else:
            def vocab_chunk(carry, v0, vn):
                dh, dw = carry
                dh, dwc = _loop(tok_pieces,
                                lambda c, t0, tn: tile_grads(*c, v0, vn, t0, tn, None),
                                (dh, acc(vn)))
                return dh, write(dw, dwc, v0)

            dh, dw = _loop(voc_pieces, vocab_chunk, (dh0, dw0))
        return dh.astype(hidden.dtype), dw, None, None

    logp_entropy.defvjp(fwd_rule, bwd_rule)
    if dynamic_valid:
        return logp_entropy
    return lambda hidden, lm_head, ids: logp_entropy(hidden, lm_head, ids, None)


# dz_precision -> (dhidden's, dlm_head's) 16-bit terms of dz (make_logp_entropy's dz_terms);
# "f32": one matmul of f32 operands at the implementation's precision.
_DZ_TERMS = {"x3": (3, 3), "x2": (2, 2), "x3_dlm_head": (1, 3), "x1": (1, 1), "f32": None}


def _dz_class(options: Mapping[str, Any], dtype: str) -> Optional[str]:
    """The precision class ``dz_precision`` names for 16-bit inputs (docs/spec.md,
    "Precision classes"): one bf16 term of dz is ``bf16``, three for dlm_head ``bf16x3``,
    three for both ``f32``; f32 dz (and f32 inputs) are shown by the dots themselves."""
    if dtype == "f32":
        return None
    return {"x1": "bf16", "x3_dlm_head": "bf16x3", "x3": "f32"}.get(options["dz_precision"])


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
    if options["lm_head_fetch"] not in (None,) + lm_head_fetch.FETCHES:
        raise RequestError(f"impl_options.lm_head_fetch must be null ('slice'), 'slice' or "
                           f"'pallas', got {options['lm_head_fetch']!r}")
    if options["dz_precision"] not in _DZ_TERMS:
        raise RequestError(f"impl_options.dz_precision must be one of {sorted(_DZ_TERMS)}, "
                           f"got {options['dz_precision']!r}")


def per_token(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """(hidden [B, T, H], lm_head [H, V], ids [B, T], valid_v=None, with_lse=False) ->
    (logp, entropy[, lse]) [B, T]; columns >= valid_v (a traced count) are padding; lse
    (the row's logsumexp) is differentiable too when asked for."""
    if problem.level != "fused":
        raise ValueError("xla_chunked implements the fused level only")
    _validate_options(options)
    precision = (jax.lax.Precision.HIGHEST if options["matmul_precision"] == "highest"
                 else jax.lax.Precision.DEFAULT)
    return _core(problem, k, options, precision=precision,
                 dz_terms=_DZ_TERMS[options["dz_precision"]])


def _vocab_major(problem: Problem, options: Mapping[str, Any]) -> bool:
    """Whether the kernel works on lm_head.T (see Layout)."""
    order = options["lm_head_layout"] or (
        "".join("hv"[i] for i in tpu_default_order((problem.h, problem.v), problem.dtype))
        if problem.platform == "tpu" else "hv")
    return order == "vh"


def _fetch(problem: Problem, options: Mapping[str, Any]):
    """(lm_head_fetch resolved, None) or (None, why the case is not supported): null is
    "slice"; "pallas" on tpu needs the scanned chunks' offsets tile-aligned (a DMA offset
    that is not cannot be compiled for a TPU)."""
    fetch = options["lm_head_fetch"] or "slice"
    chunk = min(options["chunk_vocab"], problem.v)
    align = lm_head_fetch.alignment(0 if _vocab_major(problem, options) else 1)
    aligned = problem.v // chunk < 2 or chunk % align == 0  # a lone chunk is sliced
    if fetch == "pallas" and problem.platform == "tpu" and not aligned:
        return None, (f"lm_head_fetch 'pallas' on tpu needs chunk_vocab a multiple of "
                      f"{align} (a tile-aligned DMA offset), not {options['chunk_vocab']}")
    return fetch, None


def _core(problem: Problem, k: Knobs, options: Mapping[str, Any], *, precision,
          **saved_logits):
    """The per-token core of both implementations of this module (``saved_logits``:
    ``make_logp_entropy``'s save_logits, dz_terms and _unsafe_lse_shift)."""
    b, t, h, v = problem.b, problem.t, problem.h, problem.v
    n = b * t
    vocab_major = _vocab_major(problem, options)
    fetch, reason = _fetch(problem, options)
    if reason is not None:
        raise RequestError(reason)
    kernel = make_logp_entropy(
        n=n, v=v, dtype=jnp.dtype({"f32": f32, "bf16": jnp.bfloat16,
                                   "f16": jnp.float16}[problem.dtype]),
        temperature=k.temperature, logits_dtype=k.logits_dtype,
        chunk_tokens=options["chunk_tokens"], chunk_vocab=options["chunk_vocab"],
        precision=precision, vocab_major=vocab_major, dynamic_valid=True, fetch=fetch,
        interpret=problem.platform != "tpu", **saved_logits)

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
                     "lm_head_layout": None, "lm_head_fetch": None, "dz_precision": "f32"},
    extra_check=lambda p, k, o: _validate_options(o) or _fetch(p, o)[1],
    validate_options=_validate_options,
    per_token=per_token,
    # matmul_precision "default" trades the f32 matmuls' precision for speed, declared:
    # on CPU those matmuls are then computed as a TPU would (operands rounded to bf16).
    reduced_precision=lambda o: (None if o["matmul_precision"] == "highest"
                                 else f"matmul_precision: {o['matmul_precision']}"),
    # Few: libtpu takes minutes per compile of these loops at the seeds' shape.
    search_space={"chunk_tokens": (512, 2048), "chunk_vocab": (4096, 16384)},
    option_class=_dz_class,
)


# xla_saved_logits: the time corner of the fused front (issue 38) -------------------------

_SAVED_DEFAULTS = {"chunk_tokens": 8192, "chunk_vocab": 2048, "lm_head_layout": None,
                   "lm_head_fetch": None,
                   "dz_precision": "x3"}


def _validate_saved(options: Mapping[str, Any]) -> None:
    _validate_options({**options, "matmul_precision": "highest"})
    shift = options.get("_unsafe_lse_shift", 0)
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise RequestError(f"_unsafe_lse_shift must be an integer, got {shift!r}")


def saved_per_token(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """xla_chunked's core with the logits saved by the forward and read back by the
    backward (``make_logp_entropy``'s ``save_logits``); its f32 matmuls at HIGHEST."""
    if problem.level != "fused":
        raise ValueError("xla_saved_logits implements the fused level only")
    _validate_saved(options)
    return _core(problem, k, options, precision=jax.lax.Precision.HIGHEST, save_logits=True,
                 dz_terms=_DZ_TERMS[options["dz_precision"]],
                 _unsafe_lse_shift=options.get("_unsafe_lse_shift", 0))


def saved_build(problem: Problem, k: Knobs, options: Mapping[str, Any]):
    """All SPEC inputs in order -> (loss, metrics..., dhidden, dlm_head)."""
    return grpo_math.spec_function(saved_per_token(problem, k, options), k, nhead=2)


IMPLEMENTATION_SAVED = Implementation(
    id="xla_saved_logits",
    description="fused LM head in plain XLA, the time corner: the forward writes the logits "
                "(logits_dtype) and lse, the backward reads them back (3 logits-sized "
                "matmuls, nothing recomputed); dz enters the backward products as 16-bit "
                "terms (dz_precision: three each by default)",
    build=saved_build,
    capabilities=Capabilities(levels=frozenset({"fused"})),
    default_options=dict(_SAVED_DEFAULTS),
    extra_check=lambda p, k, o: _validate_saved(o) or _fetch(p, o)[1],
    validate_options=_validate_saved,
    per_token=saved_per_token,
    search_space={"chunk_tokens": (2048, 8192), "chunk_vocab": (2048, 4096)},
    option_class=_dz_class,
)
