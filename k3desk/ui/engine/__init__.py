"""The engine: controller (supervisor as Qt signals) and its page."""
