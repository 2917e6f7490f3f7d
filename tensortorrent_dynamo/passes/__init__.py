"""Graph passes over the functional graph: the row-chunked alternative the planner may
choose (``chunk_weights``) and the rewrite that turns a plan into the schedule the graph
runs (``rewrite``: segments, transfers, prefetches, evictions, spills)."""
