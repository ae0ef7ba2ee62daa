"""Downloads: one controller for all shard downloads, and the panel that shows one."""
