"""compiling."""
