"""Developer tools: tiny test models and sparse twins of published tiers."""
