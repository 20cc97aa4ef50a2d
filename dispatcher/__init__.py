"""dispatcher: what decides at run time (lookup, memory fit, fallback, explain, patching, CLI)."""
