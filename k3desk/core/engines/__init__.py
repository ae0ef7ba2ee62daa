"""The inference engine: find llama-server (discovery), learn what it can do here (probe),
build one for this machine (install), run and keep it running (supervisor), and explain
how it stopped (crash).  ``launch`` composes them for a model: validate the shard set, pick
and probe an engine, plan, and re-plan after a crash; every local launch goes through it.
``canary`` writes the tiny kimi-k3 files the probe and tests load."""
