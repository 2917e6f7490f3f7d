"""Compiling each segment of a rewritten graph for its device (``segments``: Inductor or
eager, and the measured choice between them) and checking a first call against eager
(``verify``)."""
