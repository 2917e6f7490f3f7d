"""run: what the rewritten graph runs with.

``ops`` (the graph ops and ``Segment``) -> ``runtime`` (``Runtime``) -> ``virtual`` (the
virtual accelerator and its copy engine), ``residents`` (disk tier, resident copies) ->
``copies`` (the copy-engine interface, the host and CUDA engines, ``landing``) ->
``handles`` (copies in flight), ``record`` (measured spans, RSS).
"""
