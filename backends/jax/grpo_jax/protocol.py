"""The exporter protocol version: what the Rust side and this package agree on.

Bumped whenever a request field, a result field or a manifest field changes meaning. The
Rust side passes ``--protocol N`` to every exporter command and the exporter refuses a
different N with one line (exit status 4), so a ``grpo_jax`` installed into a user's own
environment that is older or newer than the suite is one clear error, not a confusing
failure later. Importing this module imports nothing else (the probe is cheap).
"""

PROTOCOL_VERSION = 1

# Exit status of the exporter when the protocol versions differ.
MISMATCH_EXIT = 4
