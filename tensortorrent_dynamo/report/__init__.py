"""What a compiled model tells its user: ``explain()`` (``explain``) and Chrome/Perfetto
traces of the simulated and measured timelines (``trace``)."""
