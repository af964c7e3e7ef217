"""The registry of implementations under test: ``IMPLEMENTATIONS[id] -> Implementation``.

To add one: write ``impls/<name>.py`` exposing ``IMPLEMENTATION`` (see interface.py and
docs/implementations.md) and append it to ``_ENTRIES`` below.
"""

from __future__ import annotations

from . import baseline, pallas_fused, pallas_logits, xla_chunked
from .interface import Implementation

_ENTRIES: list[Implementation] = [
    baseline.IMPLEMENTATION,
    pallas_logits.IMPLEMENTATION,
    pallas_logits.IMPLEMENTATION_JAXBWD,
    xla_chunked.IMPLEMENTATION,
    pallas_fused.IMPLEMENTATION,
]

IMPLEMENTATIONS: dict[str, Implementation] = {impl.id: impl for impl in _ENTRIES}


def get(impl_id: str) -> Implementation:
    """The implementation ``impl_id`` (KeyError with the known ids if absent)."""
    try:
        return IMPLEMENTATIONS[impl_id]
    except KeyError:
        raise KeyError(f"unknown impl {impl_id!r} (known: {sorted(IMPLEMENTATIONS)})") from None
