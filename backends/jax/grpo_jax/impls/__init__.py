"""Implementations under test. ``registry.IMPLEMENTATIONS`` maps id -> Implementation."""

from .interface import Capabilities, Implementation
from .registry import IMPLEMENTATIONS, get

__all__ = ["Capabilities", "Implementation", "IMPLEMENTATIONS", "get"]
