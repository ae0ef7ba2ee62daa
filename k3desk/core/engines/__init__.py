"""The inference engine: find llama-server (discovery), learn what it can do here (probe),
build one for this machine (install), run and keep it running (supervisor), and explain
how it stopped (crash).  ``canary`` writes the tiny kimi-k3 files the probe and tests load."""
