"""The plan applied to the model's weights: tensors whose bytes are on disk
(``released``: bound to a checkpoint or released to the offload store), weights the plan
puts on disk (``disk``) and weights pinned for asynchronous copies (``pinning``)."""
