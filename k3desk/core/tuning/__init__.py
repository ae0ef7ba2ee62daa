"""Measured speeds, the per-machine correction, and the tuner.

The tuner's test request lives here so that the CLI can show its defaults without
importing the tuner itself."""

PROMPT_TOKENS = 512  # a first chat turn with a system prompt; long enough to tell -ub apart
DECODE_TOKENS = 32
