"""The registry of implementations under test: ``IMPLEMENTATIONS[id] -> Implementation``.

To add one: write ``impls/<name>.py`` exposing ``IMPLEMENTATION`` (see interface.py and
docs/implementations.md) and append it to ``_ENTRIES`` below.

An id of the form ``module:attribute`` names an implementation outside this package (a
user's kernel in their own repository, docs/external.md): the module is imported from the
exporter's ``sys.path`` (the config's ``pythonpath`` entries come first) and the attribute
(dotted paths allowed) must be an ``Implementation``, e.g. one built by ``grpo_jax.adapters``.
"""

from __future__ import annotations

import functools
import importlib
import sys

from . import baseline, pallas_fused, pallas_logits, pallas_logits_2pass, xla_chunked
from .interface import Implementation

_ENTRIES: list[Implementation] = [
    baseline.IMPLEMENTATION,
    pallas_logits.IMPLEMENTATION,
    pallas_logits.IMPLEMENTATION_JAXBWD,
    pallas_logits_2pass.IMPLEMENTATION,
    xla_chunked.IMPLEMENTATION,
    xla_chunked.IMPLEMENTATION_SAVED,
    pallas_fused.IMPLEMENTATION,
]

IMPLEMENTATIONS: dict[str, Implementation] = {impl.id: impl for impl in _ENTRIES}


def is_external(impl_id: str) -> bool:
    """Whether ``impl_id`` names an implementation outside the package (``module:attr``)."""
    return ":" in impl_id


@functools.lru_cache(maxsize=None)
def resolve_external(spec: str) -> Implementation:
    """Imports ``module:attribute``; RequestError (one line) when it cannot."""
    from ..spec import RequestError
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RequestError(f"external implementation {spec!r}: expected 'module:attribute'")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise RequestError(
            f"external implementation {spec!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}) with {sys.executable}; check the entry's "
            f"`pythonpath` and `python` in the config") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module failed at import
        from ..errors import one_line
        raise RequestError(f"external implementation {spec!r}: importing {module_name!r} "
                           f"raised {one_line(exc)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RequestError(f"external implementation {spec!r}: module {module_name!r} "
                               f"has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, Implementation):
        raise RequestError(
            f"external implementation {spec!r} is a {type(obj).__name__}, not a "
            f"grpo_jax Implementation (wrap a plain function with grpo_jax.adapters)")
    return obj


def external_source_hash(spec: str) -> str:
    """The digest of everything the external implementation is built from: its top-level
    package's .py files, every checkout module it reaches, and the versions of the
    installed distributions it reaches (``grpo_jax.sources``), so a changed kernel gets a
    new cache key wherever it lives."""
    from .. import sources
    resolve_external(spec)
    return sources.digest(importlib.import_module(spec.partition(":")[0]))


def get(impl_id: str) -> Implementation:
    """The implementation ``impl_id`` (KeyError with the known ids if absent; RequestError
    for an external one that cannot be imported)."""
    if is_external(impl_id):
        return resolve_external(impl_id)
    try:
        return IMPLEMENTATIONS[impl_id]
    except KeyError:
        raise KeyError(f"unknown implementation id {impl_id!r}; known: {sorted(IMPLEMENTATIONS)} "
                       f"(an implementation outside grpo_jax is named 'module:attribute')") from None
