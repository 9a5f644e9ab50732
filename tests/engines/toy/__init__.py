"""A test-only engine: what adding an engine takes (docs/engines.md, "Adding an engine")."""
