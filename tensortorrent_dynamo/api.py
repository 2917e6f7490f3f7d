"""``tt.compile``: plan a model now and get back a module that can explain itself."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .backend import TensorTorrentBackend
from .cost_graph import CostGraph, build_cost_graph
from .errors import CheckpointError, PlanFormatError, TensorTorrentError
from .functional import capture
from .plan import files as saved_plan
from .report.explain import explain
from .report.trace import write_trace
from .run.ops import global_hooks
from .session import CompiledGraph
from .settings import parse_options
from .weights.released import bind_checkpoint, own_memory

log = logging.getLogger(__name__)


class CompiledModule(torch.nn.Module):
    """A model compiled with TensorTorrent; call it like the model.

    ``explain()`` describes the plan of every graph Dynamo captured, with measured
    peaks once the model has run.
    """

    def __init__(self, model: torch.nn.Module, backend: TensorTorrentBackend) -> None:
        super().__init__()
        self.model = model
        self.backend = backend
        # torch's compiled module, kept out of this module's children: its ``_orig_mod`` is
        # ``model``, and as a child it would put every weight in ``state_dict()`` twice
        self.__dict__["compiled"] = torch.compile(model, backend=backend)
        # the same, found without nn.Module's (and this class's) attribute lookup on each call
        self.__dict__["_call_compiled"] = self.compiled
        self.register_load_state_dict_pre_hook(_keys_of_the_model)  # type: ignore[no-untyped-call]
        self.register_load_state_dict_post_hook(_keys_said_as_given)  # type: ignore[no-untyped-call]
        # the model's forward compiled with the backend, for ``generate()`` (made at its
        # first call); the generate() calls running, and the forward the model had before
        self._compiled_forward: Any = None
        self._generating = 0
        self._generating_lock = threading.Lock()
        self._own_forward: Any = None
        self._disk_bytes_read = 0
        self._graphs_checked = False

    @property
    def graphs(self) -> list[CompiledGraph]:
        return self.backend.graphs

    def __getattr__(self, name: str) -> Any:
        # what this module lacks is the model's (``config``, ``device``, ``dtype``, its
        # methods), as for torch.compile's module: code written for the model, a diffusers
        # pipeline given the compiled UNet, keeps working
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # nn.Module's call machinery costs microseconds a call: only a module with hooks
        # needs it
        if self._forward_hooks or self._forward_pre_hooks or global_hooks():
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        before = self._disk_bytes_total()
        try:  # not a context manager: this is each call's path
            out = self._call_compiled(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            _raise_ours(exc)
            raise
        after = self._disk_bytes_total()
        if after is not None:
            # a plain attribute write: ``nn.Module.__setattr__`` costs microseconds
            self.__dict__["_disk_bytes_read"] = after - (before or 0)
        if not self.__dict__["_graphs_checked"]:
            self.__dict__["_graphs_checked"] = True
            if not self.graphs:
                log.warning(
                    "the first call of the compiled %s gave TensorTorrent no graph to plan: "
                    "Dynamo ran all of it eagerly (graph breaks or code it skips; "
                    "TORCH_LOGS=graph_breaks shows why), so nothing was planned and no budget "
                    "applied to it",
                    type(self.model).__name__,
                )
        return out

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The model's ``state_dict()``, with its keys: a checkpoint saved from the compiled
        module loads into the model and back (also where this module is another's child)."""
        return self.model.state_dict(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's ``generate()`` (transformers'), each step's forward run by the plans.

        For the call, the model's ``forward`` is compiled with this module's backend (as
        transformers' docs advise for ``torch.compile``): its graphs are among
        :attr:`graphs`, so ``explain()``, ``save()`` and ``tt.load`` cover them. Pass a
        static cache (``cache_implementation="static"``) for one prefill and one decode
        graph rather than one per length. Transformers' own compile of the forward is
        turned off (``disable_compile=True``) unless asked for: it would take the place of
        these plans."""
        model = self.model
        generate = getattr(model, "generate", None)
        if not callable(generate):
            raise AttributeError(f"{type(model).__name__} has no generate()")
        if hasattr(getattr(model, "generation_config", None), "disable_compile"):
            kwargs.setdefault("disable_compile", True)
        with self._forward_compiled(model):
            try:
                return generate(*args, **kwargs)
            except torch._dynamo.exc.BackendCompilerFailed as exc:
                _raise_ours(exc)
                raise

    @contextlib.contextmanager
    def _forward_compiled(self, model: torch.nn.Module) -> Iterator[None]:
        """``model.forward`` compiled with the backend while a ``generate()`` runs; several
        threads generating at once share it, and the last to finish puts back the forward
        the model had (the class's, or one the user set on the instance)."""
        with self._generating_lock:
            if self._generating == 0:
                self._own_forward = model.__dict__.get("forward")
                if self._compiled_forward is None:
                    self._compiled_forward = torch.compile(model.forward, backend=self.backend)
                model.forward = self._compiled_forward
            self._generating += 1
        try:
            yield
        finally:
            with self._generating_lock:
                self._generating -= 1
                if self._generating == 0:
                    if self._own_forward is None:
                        del model.forward
                    else:
                        model.forward = self._own_forward

    def explain(self) -> str:
        return explain(self.graphs)

    def to_device_map(self) -> dict[str, int | str]:
        """An Accelerate-style ``device_map`` (module name -> device) of the plans.

        A module maps to a device when all its parameters are resident there, to
        ``"cpu"`` when they stay in host RAM (streamed or run on the host). CUDA
        devices are given as indices, as Accelerate expects.
        """
        placement: dict[str, str] = {}
        for graph in self.graphs:
            placement.update(graph.plan.param_placement())
        by_module: dict[str, set[str]] = {}
        for fqn, device in placement.items():
            by_module.setdefault(fqn.rpartition(".")[0], set()).add(device)
        device_map: dict[str, int | str] = {}
        for module, devices in sorted(by_module.items()):
            device = devices.pop() if len(devices) == 1 else "cpu"
            device_map[module] = int(device[5:]) if device.startswith("cuda:") else device
        return device_map

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plans of every compiled graph to ``path`` (JSON; see ``tt.load``)."""
        graphs = self.graphs
        if not graphs:
            raise PlanFormatError("nothing to save: no graph has been compiled yet")
        first = graphs[0]
        saved_plan.save(
            path,
            [g.plan for g in graphs],
            first.profile,
            first.settings.to_options(),
            self.explain(),
        )

    def trace(self, path: str | os.PathLike[str]) -> None:
        """Write a Chrome/Perfetto trace: the simulated timeline and, after a call, the
        measured one, one track per device and link."""
        write_trace(path, self.graphs)

    def plan_hashes(self) -> list[str]:
        return [g.plan.plan_hash for g in self.graphs]

    def _disk_bytes_total(self) -> int | None:
        """Bytes the sessions' disk readers read so far; ``None`` while no session reads
        from disk."""
        readers = [s.disk.reader for s in self.backend.sessions.values() if s.disk is not None]
        return sum(r.bytes_read for r in readers) if readers else None

    def disk_bytes_read(self) -> int:
        """Bytes of parameters read from disk during the last call (measured by the reader)."""
        return self._disk_bytes_read

    def measured_peaks(self) -> dict[str, int]:
        """Peak bytes measured on each virtual device since compiling."""
        peaks: dict[str, int] = {}
        for graph in self.graphs:
            for name, dev in graph.runtime.virtual.items():
                peaks[name] = max(peaks.get(name, 0), dev.ledger.peak)
        return peaks


def _keys_of_the_model(
    module: CompiledModule, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """``load_state_dict`` takes the keys ``state_dict()`` gives, the model's: each is moved
    under ``model.``, where this module holds it. The compiled graphs then run on the loaded
    weights, wherever their plans keep them."""
    module.__dict__["_loading_prefix"] = prefix
    tensors = module.model.state_dict(keep_vars=True)
    keys = [key for key in state_dict if key.startswith(prefix)]
    for key in keys:
        value = state_dict.pop(key)
        state_dict[f"{prefix}model.{key[len(prefix) :]}"] = value
        tensor = tensors.get(key[len(prefix) :])
        if (
            isinstance(tensor, torch.Tensor)
            and isinstance(value, torch.Tensor)
            and value.shape == tensor.shape
            and not value.is_meta
        ):
            # a weight whose bytes are on disk takes the new ones in RAM of its own (where
            # torch can copy them, so none is left unwritten), and is planned again with
            # them; written where it is, it would be too, at the cost of a copy more
            own_memory(tensor)


def _keys_said_as_given(module: CompiledModule, incompatible: Any) -> None:
    """Missing and unexpected keys named as the caller gave them, without ``model.``."""
    prefix = module.__dict__.pop("_loading_prefix", "")
    inner = f"{prefix}model."
    for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
        keys[:] = [prefix + k[len(inner) :] if k.startswith(inner) else k for k in keys]


def _raise_ours(exc: torch._dynamo.exc.BackendCompilerFailed) -> None:
    """Raise the error of ours Dynamo wrapped in ``exc`` (it wraps whatever a backend
    raises) as it is: it says more alone. Returns for any other."""
    if isinstance(exc.inner_exception, TensorTorrentError):
        raise exc.inner_exception from None


def compile(
    model: torch.nn.Module,
    example_inputs: Sequence[Any] | None = None,
    **options: Any,
) -> CompiledModule:
    """Compile ``model`` with TensorTorrent; with ``example_inputs``, plan right away.

    Options are those of ``torch.compile(..., backend="tensortorrent", options={...})``.
    Planning runs the model once on ``example_inputs`` (under ``torch.no_grad()``).
    With ``checkpoint="model.safetensors"``, ``model`` may be built on the meta device:
    its meta tensors are bound to the file (see :func:`bind_checkpoint`) and its weights
    are read from there, never all held in RAM.
    """
    settings = parse_options(options)  # bad options fail here, before any tracing
    if settings.checkpoint is not None:
        bind_checkpoint(model, settings.checkpoint)
    _check_no_meta(model)
    compiled = CompiledModule(model, TensorTorrentBackend(options))
    if example_inputs is not None:
        with torch.no_grad():
            compiled(*example_inputs)
    return compiled


def _check_no_meta(model: torch.nn.Module) -> None:
    """Refuse a model with meta tensors left: Dynamo cannot run it and nothing holds its
    weights. Those of a module Accelerate's offload hooks hold the weights of (a model
    dispatched with ``cpu_offload``, ``disk_offload`` or a ``device_map`` offloading to the
    CPU or disk) are put in place by the hooks at each call, as with ``torch.compile``:
    allowed, with a warning that they are outside the plan and its budgets."""
    meta: list[str] = []
    hooked: list[str] = []

    def walk(module: torch.nn.Module, prefix: str, held: bool) -> None:
        held = held or hasattr(module, "_hf_hook")  # a hook places its submodules' too
        for name, t in [*module._parameters.items(), *module._buffers.items()]:
            if t is not None and t.device.type == "meta":
                (hooked if held else meta).append(prefix + name)
        for name, child in module.named_children():
            walk(child, f"{prefix}{name}.", held)

    walk(model, "", False)
    if hooked:
        log.warning(
            "%d tensor(s) of the model are on the meta device, their weights held by "
            "Accelerate's offload hooks (%s%s), which put them in place at each call: they "
            "are moved eagerly, outside the plan and its budgets. To have TensorTorrent place "
            "them, load the model without offloading (on the meta device, with checkpoint= "
            "naming its safetensors files)",
            len(hooked),
            ", ".join(hooked[:3]),
            ", ..." if len(hooked) > 3 else "",
        )
    if meta:
        listed = ", ".join(meta[:4]) + (", ..." if len(meta) > 4 else "")
        raise CheckpointError(
            f"{len(meta)} tensor(s) of the model are on the meta device ({listed}) and no "
            "checkpoint holds their weights: pass checkpoint='model.safetensors'"
        )


def load(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    example_inputs: Sequence[Any] | None = None,
    replan: str = "new",
) -> CompiledModule:
    """Compile ``model`` with the plans saved at ``path`` (by ``CompiledModule.save``).

    Each graph the file has must be the one the plan was saved for, on the same hardware
    and profile: otherwise ``StalePlanError`` says what changed, or, with
    ``replan="auto"``, the graph is planned again with a warning saying why. A graph the
    file has at other sizes replays its decisions at these. A graph it lacks, of the model
    it was saved for (one the saving session did not trace: Dynamo traces the calls of other
    shapes, or in another order, as other graphs), is planned when traced, with a warning
    (``replan="new"``), or refused (``UnsavedGraphError``, with ``replan="error"``).
    """
    saved = saved_plan.load(path)
    return compile(model, example_inputs, **saved.options, plan=str(path), replan=replan)


def export_cost_graphs(model: torch.nn.Module, example_inputs: Sequence[Any]) -> list[CostGraph]:
    """The cost graph of the functional graph of every graph Dynamo captures from ``model``
    (one per graph break): what the backend plans.

    Nothing is planned; save each with ``CostGraph.save`` to plan it offline
    (``tensortorrent cost-graph FILE``) or to attach it to a bug report.
    """
    return [
        build_cost_graph(gm, inputs.values, inputs.params)
        for gm, inputs in capture(model, *example_inputs)
    ]
