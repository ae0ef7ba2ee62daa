"""The tier-picker wizard."""
