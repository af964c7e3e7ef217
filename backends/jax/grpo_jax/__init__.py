"""grpo_jax: JAX/Pallas GRPO loss implementations under test and their StableHLO exporter.

Submodules:
  spec      -- knob parsing/validation and shared constants (dtype names, I/O names).
  impls     -- the implementations; ``impls.registry.IMPLEMENTATIONS`` maps id -> Implementation.
  export    -- CLI turning JSON requests into cached StableHLO artifacts.
"""

__version__ = "0.1.0"
