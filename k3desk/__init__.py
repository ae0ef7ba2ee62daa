"""k3desk: pick, download, launch and chat with Kimi-K3 GGUF quantizations."""

__version__ = "0.1.0"
