"""The chat window: conversations, message view, composer."""
