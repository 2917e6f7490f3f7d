"""Graph passes, in the order they run on a functional graph:

1. ``batch_norm_layout`` (before costing): a batch norm's output over an input of an
   unusual layout laid out as the graph was traced (torch's CPU kernel and its meta
   function disagree);
2. ``grouped_attention`` (before costing): a decode step's attention over key/value heads
   repeated per query head attends the unrepeated heads (no copy of the cache per head);
3. ``param_views`` (before costing): one copy of a parameter's view per reader;
4. ``state_in_place`` (before costing): a KV cache's update written into the cache again
   where the functional graph made a new one;
5. ``chunk_weights`` (before planning): the graph with large linear weights in row chunks,
   the alternative the planner plans when weights go to disk;
6. ``rewrite`` (after planning): the plan as the schedule the graph runs (segments,
   transfers, prefetches, evictions, spills).

Each shows its graph before and after under ``TORCH_LOGS="tensortorrent_passes"``
(``logged``). They take what they need besides the graph (the parameters, the chunk size,
the plan), so they are called by the stages that have it (``functional``, ``pipeline``)
rather than from one pass manager; the first four are ``torch.fx`` infra passes.
"""
