"""One-line descriptions of exceptions raised while importing, building or tracing an
implementation: what (the exception's type and message, whitespace collapsed) and where
(the innermost frame of the implementation's own code, not jax's, this package's or
Python's). The exporter never prints a traceback for them; the Rust side shows this line.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from typing import Optional


def _library_dirs() -> list[str]:
    """Directories whose frames are not the implementation's own: the standard library,
    this package, jax and jaxlib."""
    paths = sysconfig.get_paths()
    dirs = [paths.get("stdlib"), paths.get("platstdlib"),
            os.path.dirname(os.path.abspath(__file__))]
    for name in ("jax", "jaxlib"):
        mod = sys.modules.get(name)
        if getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return [os.path.realpath(d) + os.sep for d in dirs if d]


def where(exc: BaseException) -> Optional[str]:
    """``file:line in function`` of the innermost frame outside the libraries, or None."""
    lib = _library_dirs()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith("<"):
            continue
        if any(os.path.realpath(frame.filename).startswith(d) for d in lib):
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return None


def one_line(exc: BaseException, limit: int = 2000) -> str:
    """``Type: message (at file:line in function)`` on one line, the message cut at
    ``limit`` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    if len(text) > limit:
        text = text[:limit] + "…"
    at = where(exc)
    return f"{text} (at {at})" if at else text
