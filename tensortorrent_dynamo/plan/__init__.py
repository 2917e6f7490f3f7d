"""Planning: the native planner's inputs and answer (``planner``), each parameter's
:class:`~.residency.Residency` built once from that answer (``residency``), and plans as
values (``decisions``) that the plan cache (``cache``) and saved plans (``files``) store
and replay."""
