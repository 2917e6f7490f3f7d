"""Plans as files: what a saved plan holds, and the check that it still applies.

A saved plan records, per graph, the graph's hash (of its cost graph as traced) and its hash
without sizes (the same graph traced at other shapes has the same), the plan hash, the
planner's decisions (``decisions.Decisions``, the form the plan cache stores too), a
readable copy of them (placement, residency, the prefetch/evict schedule), the prediction
and the dtype and shape of each weight the graph reads; and, once, the format version, the
torch and TensorTorrent versions, the hardware fingerprint, the profile's figures and their
hash, and the settings. Reloading replays the decisions, without searching, and checks that the
same plan hash comes out (a graph the file has at other sizes replays its decisions, which
give a plan of those sizes); anything that changed is named. A graph the file lacks, of the
model it was saved for (its weights are the file's), is one the saving session did not trace
(a loaded model called with other shapes, or in another order): :class:`UnsavedGraphError`,
which ``replan="new"`` (the default) plans when it is traced. The text of ``explain()`` is
kept as it read when saved, so ``tensortorrent explain plan.json`` prints it without the model.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..cost_graph import CostGraph
from ..errors import PlanFormatError, StalePlanError, UnsavedGraphError
from ..io.files import digest, read_json, write_json
from ..profile import HostProfile
from ..profile.detect import current_fingerprint
from ..profile.schema import Fingerprint, Measurements
from ..settings import SAVED_OPTIONS
from .decisions import Decisions

if TYPE_CHECKING:
    from .planner import GraphPlan

PLAN_FORMAT = "tensortorrent-plan"
PLAN_FORMAT_VERSION = 2

_T = TypeVar("_T")


def profile_hash(profile: HostProfile) -> str:
    """A hash of the figures the planner reads from a profile."""
    figures = [dataclasses.asdict(d) for d in profile.devices]
    for figure in figures:
        figure.pop("memory_bytes", None)  # free RAM moves from run to run; budgets are saved
    return digest(figures)


def graph_record(plan: GraphPlan) -> dict[str, Any]:
    """Everything saved about one graph's plan."""
    cost = plan.cost
    native = plan.native
    stays: dict[int, list[dict[str, str | int]]] = {}
    for stay in plan.stays():
        stays.setdefault(stay.param, []).append(
            {
                "device": stay.device,
                "issue_segment": stay.issue_segment,
                "first_segment": stay.first_segment,
                "last_segment": stay.last_segment,
            }
        )
    return {
        "graph_hash": plan.traced.digest(),
        "structure_hash": plan.traced.structure_digest(),
        "plan_hash": plan.plan_hash,
        "decisions": Decisions.of(native, plan.split, plan.chunk_bytes).to_json(),
        "chosen": native.chosen,
        "predicted_time_s": plan.predicted_time_s,
        "devices": [{"name": d.name, "budget_bytes": d.budget_bytes} for d in plan.devices],
        "weights": {p.fqn: {"dtype": p.dtype, "shape": list(p.shape)} for p in plan.traced.params},
        "placement": {n.name: plan.node_device(i) for i, n in enumerate(cost.nodes)},
        "residency": {
            p.fqn: {
                "device": r.device,
                "streamed": r.streams,
                "tier": r.tier.value,
                "stays": stays.get(i, []),
            }
            for i, (p, r) in enumerate(zip(cost.params, plan.residency, strict=True))
        },
        "segments": [plan.segment_device(s) for s in range(len(native.segment_device))],
        "spilled": {
            cost.nodes[i].name: {
                "made_in_segment": native.node_segment[i],
                "reload_segment": native.value_reload_segment[i],
            }
            for i in plan.spilled_nodes()
        },
        "predicted_peak_bytes": {d.name: plan.predicted_peak(d.name) for d in plan.devices},
    }


@dataclasses.dataclass(frozen=True)
class SavedPlan:
    """A plan file, read and checked for format."""

    path: str
    options: dict[str, Any]
    hardware: dict[str, Any]
    profile_hash: str
    torch_version: str
    graphs: tuple[dict[str, Any], ...]
    explain: str
    # the figures the plans were made with (``None`` in files saved before they were kept)
    measurements: Measurements | None = None

    def figures(self) -> Measurements | None:
        """The figures to plan with on this machine: the file's, on the hardware it was
        saved on (``None`` elsewhere, or for a file without them)."""
        if self.measurements is None or self._other_hardware():
            return None
        return self.measurements

    def _other_hardware(self) -> list[str]:
        """What makes this machine another kind than the one the plan was saved on."""
        return Fingerprint.from_dict(self.hardware, "hardware").other_kind(current_fingerprint())

    def plan_hashes(self) -> frozenset[str]:
        """The hashes of the plans the file holds."""
        return frozenset(g["plan_hash"] for g in self.graphs)

    def record_for(self, cost: CostGraph) -> dict[str, Any] | None:
        """The record of ``cost``; else of the same graph traced at other sizes (the first
        saved: Dynamo traces a model's first call for its shapes alone, so a loaded model
        called first with other shapes, a prompt of another length, traces the graph the
        file has at other sizes); ``None`` when the file has neither."""
        wanted = cost.digest()
        exact = next((g for g in self.graphs if g["graph_hash"] == wanted), None)
        if exact is not None:
            return exact
        structure = cost.structure_digest()
        return next((g for g in self.graphs if g.get("structure_hash") == structure), None)

    def check(self, cost: CostGraph, profile: HostProfile) -> Decisions:
        """The saved decisions for this graph; raises :class:`StalePlanError` saying what
        changed (:class:`UnsavedGraphError` where only the graph is not in the file, of the
        model it was saved for). Those of the same graph saved at other sizes have no plan
        hash (``""``): they make a plan of other sizes, of another hash."""
        changed = self._other_hardware()
        if changed:
            raise StalePlanError(
                f"{self.path} was saved on other hardware (differs in: {', '.join(changed)})"
            )
        if profile_hash(profile) != self.profile_hash:
            raise StalePlanError(
                f"{self.path} was planned with other device rates (profile "
                f"{self.profile_hash}, now {profile_hash(profile)}): re-measured or edited"
            )
        record = self.record_for(cost)
        if record is None:
            raise self._lacking(cost)
        decisions = Decisions.from_json(record["decisions"])
        if record["graph_hash"] != cost.digest():
            return dataclasses.replace(decisions, plan_hash="")
        return decisions

    def _lacking(self, cost: CostGraph) -> StalePlanError:
        """The error for ``cost``, a graph the file has no plan for: of the model the file
        was saved for (every weight it reads is one the file has, of the same dtype and
        shape), the saving session did not trace it; else the model changed, the weight
        that did named."""
        head = (
            f"{self.path} has no plan for this graph (hash {cost.digest()}; the file has "
            f"{', '.join(g['graph_hash'] for g in self.graphs)})"
        )
        saved: dict[str, dict[str, Any]] = {}
        for record in self.graphs:
            saved.update(record.get("weights", {}))
        if not any("weights" in record for record in self.graphs):  # an older file
            return StalePlanError(
                f"{head}: the model or its inputs changed since the plan was saved, or the "
                "saving session did not trace this graph (Dynamo traces one for each new set "
                "of shapes). Save the plan again with this version to have such graphs "
                'planned when they are traced, or load with replan="auto"'
            )
        for p in cost.params:
            weight = saved.get(p.fqn)
            if weight is None:
                return StalePlanError(
                    f"{head}: the model changed since the plan was saved: its weight "
                    f"{p.fqn!r} is not in the file"
                )
            if (weight["dtype"], tuple(weight["shape"])) != (p.dtype, p.shape):
                return StalePlanError(
                    f"{head}: the model changed since the plan was saved: its weight "
                    f"{p.fqn!r} is {p.dtype} {list(p.shape)}, {weight['dtype']} "
                    f"{weight['shape']} in the file"
                )
        return UnsavedGraphError(
            f"{head}: the session that saved it did not trace this graph (Dynamo traces a "
            "graph for each new set of shapes, and one for any shapes once the model was "
            "called with two: a loaded model called with other shapes, or in another order, "
            "than before saving traces graphs the file lacks)"
        )


def save(
    path: str | os.PathLike[str],
    plans: Sequence[GraphPlan],
    profile: HostProfile,
    options: Mapping[str, Any],
    explain: str,
) -> None:
    """Write ``plans`` (made with ``profile`` and ``options``) to ``path``, atomically."""
    if not plans:
        raise PlanFormatError("nothing to save: no graph has been compiled yet")
    data = {
        "format": PLAN_FORMAT,
        "format_version": PLAN_FORMAT_VERSION,
        "torch_version": torch.__version__,
        "tensortorrent_version": _version(),
        "hardware": current_fingerprint().to_dict(),
        "profile_hash": profile_hash(profile),
        # the figures themselves: loaded on the same hardware, the plans are made again with
        # them (figures measured again there differ, and would make other plans)
        **({"profile": profile.to_dict()} if profile.measurements is not None else {}),
        "options": dict(options),
        "explain": explain,
        "graphs": [graph_record(p) for p in plans],
    }
    write_json(path, data, indent=1)


def load(path: str | os.PathLike[str]) -> SavedPlan:
    """Read a plan file; refuses other formats and unknown versions, naming the version.

    Raises :class:`PlanFormatError` for a file that cannot be read or is damaged.
    """
    data = read_json(path, PlanFormatError, "a plan", "save the plan again (CompiledModule.save)")
    if not isinstance(data, Mapping) or data.get("format") != PLAN_FORMAT:
        raise PlanFormatError(f"{path} is not a TensorTorrent plan (no 'format' field)")
    version = data.get("format_version")
    if version != PLAN_FORMAT_VERSION:
        raise PlanFormatError(
            f"{path} has plan format version {version!r}; this TensorTorrent reads version "
            f"{PLAN_FORMAT_VERSION}"
        )
    try:
        return _saved_plan(str(path), data)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanFormatError(
            f"malformed plan file {path}: {exc!r}; save the plan again (CompiledModule.save)"
        ) from exc


def _saved_plan(path: str, data: Mapping[str, Any]) -> SavedPlan:
    """The plan in ``data``, every field a later check reads checked for its type."""
    options = _field(data, "options", dict)
    unknown = sorted(set(options) - SAVED_OPTIONS)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}")
    hardware = _field(data, "hardware", dict)
    Fingerprint.from_dict(hardware, "hardware")  # raises ValueError naming a bad key
    graphs = _field(data, "graphs", list)
    for i, record in enumerate(graphs):
        if not isinstance(record, dict):
            raise TypeError(f"graphs[{i}] is {type(record).__name__}, not an object")
        for key in ("graph_hash", "plan_hash"):
            _field(record, key, str, f"graphs[{i}].")
        if "structure_hash" in record:  # files saved before it was recorded lack it
            _field(record, "structure_hash", str, f"graphs[{i}].")
        if "weights" in record:  # files saved before they were recorded lack them
            for fqn, weight in _field(record, "weights", dict, f"graphs[{i}].").items():
                where = f"graphs[{i}].weights[{fqn!r}]."
                _field(weight, "dtype", str, where)
                if not all(type(n) is int for n in _field(weight, "shape", list, where)):
                    raise TypeError(f"{where}shape is not a list of integers")
        Decisions.from_json(_field(record, "decisions", dict, f"graphs[{i}]."))
    return SavedPlan(
        path=path,
        options=dict(options),
        hardware=dict(hardware),
        profile_hash=_field(data, "profile_hash", str),
        torch_version=_field(data, "torch_version", str),
        graphs=tuple(dict(g) for g in graphs),
        explain=_field(data, "explain", str),
        measurements=Measurements.from_dict(data["profile"]) if "profile" in data else None,
    )


def _field(data: Mapping[str, Any], key: str, kind: type[_T], where: str = "") -> _T:
    """``data[key]``; a ``TypeError`` naming the key when it is not a ``kind``."""
    value = data[key]
    if not isinstance(value, kind):
        raise TypeError(f"{where}{key} is {type(value).__name__}, not {kind.__name__}")
    return value


def _version() -> str:
    from .. import __version__

    return __version__
