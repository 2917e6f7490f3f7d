"""Damaged files: every loader of a file TensorTorrent reads fails with one of its own errors.

Each property starts from a real, valid file (a saved plan, a host profile, a cost graph, an
offload manifest) and damages it: random bytes, the file cut short, a few bytes overwritten,
deeply nested JSON, or the parsed JSON edited (a value somewhere replaced by a random JSON
value, a key deleted or added) and dumped again. Whatever comes out, the loader either reads
it or raises a :class:`TensorTorrentError` subclass: never ``KeyError``, ``TypeError``, a
bare ``ValueError``, ``OverflowError``, ``RecursionError`` or a crash. Two exceptions: the
profile parser (``HostProfile.from_json``) keeps its documented ``ValueError``, which
``load_profile_file`` turns into an ``OptionsError``; and the profile cache does not raise at
all: a damaged cache file is reported and measured again.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tensortorrent as tt
from tensortorrent_dynamo import cli, tensortorrent_backend
from tensortorrent_dynamo.backend import CompiledGraph
from tensortorrent_dynamo.cost_graph import CostGraph
from tensortorrent_dynamo.errors import (
    CostGraphFormatError,
    OffloadError,
    OptionsError,
    PlanFormatError,
    StalePlanError,
    TensorTorrentError,
)
from tensortorrent_dynamo.io.store import OffloadStore
from tensortorrent_dynamo.plan import files as saved_plan
from tensortorrent_dynamo.profile import HostProfile, cache
from tensortorrent_dynamo.profile.resolve import load_profile_file, nominal_measurements
from tensortorrent_dynamo.profile.schema import Measurements
from tests.models import mlp

BOUNDED = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# -- damage -------------------------------------------------------------------------------

_EDGES = st.sampled_from(
    [
        *(-1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64, 2**1024, -(10**400)),
        *(-0.0, 5e-324, 1e308, math.inf, -math.inf, math.nan),
    ]
)
"""Numbers at the edges of what a loader converts: int32, uint32, int64, uint64, float."""
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    _EDGES,
    _EDGES,
    _EDGES,
)
JSON_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)

Path_ = tuple[str | int, ...]


def _paths(doc: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every place in ``doc`` that holds a value (the root included)."""
    yield at
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, (*at, i))


def _at(doc: Any, path: Path_) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _keys(doc: Any) -> Iterator[str]:
    """Every dict key in ``doc`` (an added key is most harmful when it is a real one)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield key
            yield from _keys(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _keys(value)


@st.composite
def edited_json(draw: st.DrawFn, doc: Any) -> bytes:
    """``doc`` with one to three edits: a value replaced, a key or item deleted, a key added."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):  # one edit alone is found out least
        paths = list(_paths(doc))
        # numbers are where a wrong value passes for a right one most easily: favour them
        numbers = [p for p in paths if type(_at(doc, p)) in (int, float)]
        path = draw(st.sampled_from(numbers if numbers and draw(st.booleans()) else paths))
        if not path:
            doc = draw(JSON_VALUES)
            continue
        parent, last = _at(doc, path[:-1]), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            number = type(parent[last]) in (int, float)
            parent[last] = draw(_EDGES | JSON_VALUES if number else JSON_VALUES)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            known = sorted(set(_keys(doc)))
            parent[draw(st.sampled_from(known) | st.text(max_size=8))] = draw(JSON_VALUES)
        else:
            parent.insert(int(last), draw(JSON_VALUES))
    return json.dumps(doc).encode()


def damaged(valid: bytes) -> st.SearchStrategy[bytes]:
    """Damaged variants of the valid JSON file ``valid``."""
    doc = json.loads(valid)
    truncated = st.integers(0, len(valid) - 1).map(lambda n: valid[:n])
    overwritten = st.lists(
        st.tuples(st.integers(0, len(valid) - 1), st.binary(min_size=1, max_size=4)),
        min_size=1,
        max_size=4,
    ).map(lambda edits: _overwrite(valid, edits))
    nested = st.tuples(st.sampled_from(["[", '{"a": ', '[{"a": ']), st.integers(1, 100_000)).map(
        lambda t: (t[0] * t[1]).encode()
    )
    edited = edited_json(doc)
    return st.one_of(st.binary(max_size=64), truncated, overwritten, nested, *[edited] * 4)


def _overwrite(valid: bytes, edits: list[tuple[int, bytes]]) -> bytes:
    data = bytearray(valid)
    for at, new in edits:
        data[at : at + len(new)] = new
    return bytes(data)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Swallow what the CLI prints and the warnings planning gives (they are not errors)."""
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A directory for the module's files; the profile cache points into it."""
    with (
        tempfile.TemporaryDirectory(prefix="tt-bad-files-") as tmp,
        mock.patch.dict(os.environ, {cache.CACHE_DIR_ENV: str(Path(tmp) / "cache")}),
    ):
        yield Path(tmp)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def outcome(
    read: Callable[[], object],
    allowed: type[Exception] | tuple[type[Exception], ...] = TensorTorrentError,
) -> str:
    """``"read"``, or the name of the ``allowed`` error ``read`` raised; any other propagates
    (and fails the property). The outcomes show with ``--hypothesis-show-statistics``."""
    try:
        read()
    except allowed as exc:
        result = type(exc).__name__
    except BaseException as exc:
        # said where pytest shows it (past ``quiet()``): when hypothesis cannot replay the
        # failing example (for ``tt.load`` it has ended in ``FlakyStrategyDefinition``),
        # this is the failure
        print(f"unexpected {type(exc).__name__}: {exc}", file=sys.__stderr__)
        raise
    else:
        result = "read"
    event(result)
    return result


# -- saved plans ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_file(workdir: Path) -> tuple[Path, CompiledGraph]:
    """A saved plan, and the compiled graph it holds the plan of."""
    torch._dynamo.reset()
    tensortorrent_backend.reset()
    compiled = tt.compile(mlp(32, 2), (torch.randn(4, 32),), compiler="eager")
    path = workdir / "plan.json"
    compiled.save(path)
    (graph,) = compiled.graphs
    torch._dynamo.reset()
    tensortorrent_backend.reset()
    return path, graph


def test_the_valid_plan_loads(plan_file: tuple[Path, CompiledGraph]) -> None:
    path, graph = plan_file
    record = saved_plan.load(path).check(graph.plan.cost, graph.profile)
    assert record.plan_hash == graph.plan.plan_hash


@given(data=st.data())
@settings(BOUNDED, max_examples=400)
def test_a_damaged_plan_raises_plan_errors(
    plan_file: tuple[Path, CompiledGraph], workdir: Path, data: st.DataObject
) -> None:
    """``saved_plan.load``, the check each compile with ``plan=`` makes, ``tensortorrent
    explain``."""
    valid, graph = plan_file
    bad = write(workdir / "bad-plan.json", data.draw(damaged(valid.read_bytes())))

    def load_and_check() -> None:
        record = saved_plan.load(bad).check(graph.plan.cost, graph.profile)
        assert isinstance(record.plan_hash, str)  # what the backend reads of it

    outcome(load_and_check, (PlanFormatError, StalePlanError))
    with quiet():
        assert cli.main(["explain", str(bad)]) in (0, 1)


@given(data=st.data())
@settings(BOUNDED, max_examples=60)
def test_a_damaged_plan_given_to_tt_load_raises_our_errors(
    plan_file: tuple[Path, CompiledGraph], workdir: Path, data: st.DataObject
) -> None:
    """The whole of ``tt.load``: its options are parsed, the model compiled, the plan checked."""
    valid, _ = plan_file
    bad = write(workdir / "bad-plan.json", data.draw(damaged(valid.read_bytes())))
    torch._dynamo.reset()
    tensortorrent_backend.reset()
    # a damaged 'offload_dir' option is a relative path: keep it out of the checkout
    with quiet(), contextlib.chdir(workdir):
        outcome(lambda: tt.load(bad, mlp(32, 2), (torch.randn(4, 32),)))


@pytest.mark.parametrize("option", ["plan", "replan", "model"])
def test_a_plan_whose_options_name_the_plan_is_refused(
    plan_file: tuple[Path, CompiledGraph], workdir: Path, option: str
) -> None:
    """``tt.load`` passes the saved options on as keywords, next to its own."""
    valid, _ = plan_file
    data = json.loads(valid.read_text())
    data["options"][option] = "auto"
    bad = workdir / "bad-plan.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(
        PlanFormatError, match=rf"malformed plan file .*unknown option\(s\) \['{option}'\]"
    ):
        tt.load(bad, mlp(32, 2))


def test_a_plan_with_an_infinite_size_option_raises_our_error(
    plan_file: tuple[Path, CompiledGraph], workdir: Path
) -> None:
    valid, _ = plan_file
    data = json.loads(valid.read_text())
    data["options"]["stream_chunk_bytes"] = math.inf
    bad = workdir / "bad-plan.json"
    bad.write_text(json.dumps(data))
    torch._dynamo.reset()
    with pytest.raises(TensorTorrentError):
        tt.load(bad, mlp(32, 2), (torch.randn(4, 32),))


# -- host profiles ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_file(workdir: Path) -> Path:
    """This machine's nominal profile, saved in the (module's) profile cache."""
    measurements = nominal_measurements()
    path = cache.save(measurements)
    assert cache.lookup(measurements.fingerprint).measurements is not None
    return path


@given(data=st.data())
@settings(BOUNDED, max_examples=300)
def test_a_damaged_profile_file_raises_options_error(
    profile_file: Path, cost_graph_file: Path, workdir: Path, data: st.DataObject
) -> None:
    """``profile="<path>"``: ``load_profile_file``, the parser under it, planning with it."""
    bad = write(workdir / "bad-profile.json", data.draw(damaged(profile_file.read_bytes())))
    # the parser's contract is ValueError naming the key, which its callers turn into theirs
    outcome(lambda: HostProfile.from_json(bad.read_text(errors="replace"), "x"), ValueError)
    if outcome(lambda: load_profile_file(bad), OptionsError) == "read":
        with quiet():
            assert cli.main(["cost-graph", str(cost_graph_file), "--profile", str(bad)]) in (0, 1)


def _cuda_device(name: str, **figures: float) -> Callable[[dict[str, Any]], None]:
    """An edit adding a CUDA device named ``name``, a copy of the host with ``figures``."""

    def edit(data: dict[str, Any]) -> None:
        device = copy.deepcopy(data["devices"][0])
        device.update(name=name, kind="cuda")
        for key, value in figures.items():
            device[key]["value"] = value
        data["devices"].append(device)

    return edit


def _figure(value: object) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["devices"][0]["matmul"]["float32"].update(value=value)


# Rarely reached by the edits above: each of these broke the loader once.
PROFILE_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "a figure too large for a float": _figure(10**400),  # was OverflowError
    "an infinite figure": _figure(float("inf")),
    "a negative figure": _figure(-1.0),
    "a CUDA device without an index": _cuda_device("cuda"),  # was IndexError
    "an infinite CUDA memory": _cuda_device("cuda:0", memory=float("inf")),  # was OverflowError
    "the host of kind cuda": lambda data: data["devices"][0].update(kind="cuda"),
}


@pytest.mark.parametrize("edit", PROFILE_EDITS.values(), ids=PROFILE_EDITS)
def test_a_profile_the_planner_cannot_use_raises_options_error(
    profile_file: Path, workdir: Path, edit: Callable[[dict[str, Any]], None]
) -> None:
    data = json.loads(profile_file.read_text())
    edit(data)
    bad = workdir / "bad-profile.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(OptionsError, match="is not a TensorTorrent host profile"):
        load_profile_file(bad)


@given(data=st.data())
@settings(BOUNDED, max_examples=300)
def test_a_damaged_profile_cache_is_reported_not_raised(
    profile_file: Path, data: st.DataObject
) -> None:
    """A damaged cache file is a problem the lookup reports (and the caller measures again)."""
    valid = profile_file.read_bytes()
    fingerprint = Measurements.from_json(valid.decode()).fingerprint
    bad = data.draw(damaged(valid))
    readable = outcome(lambda: Measurements.from_json(bad.decode(errors="replace")), ValueError)
    other = dataclasses.replace(fingerprint, cpu_cores=fingerprint.cpu_cores + 1)
    try:
        profile_file.write_bytes(bad)
        found = cache.lookup(fingerprint)  # this machine's file
        elsewhere = cache.lookup(other)  # another machine's file, read to say what differs
    finally:
        profile_file.write_bytes(valid)
    if readable != "read":
        assert found.measurements is None and found.suspicious and found.problem
    assert elsewhere.measurements is None and elsewhere.problem


# -- cost graphs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cost_graph_file(workdir: Path) -> Path:
    """The cost graph of a small MLP, saved."""
    torch._dynamo.reset()
    (graph,) = tt.export_cost_graphs(mlp(32, 2), (torch.randn(4, 32),))
    torch._dynamo.reset()
    path = workdir / "cost-graph.json"
    graph.save(path)
    assert CostGraph.load(path) == graph
    return path


@given(data=st.data())
@settings(BOUNDED, max_examples=400)
def test_a_damaged_cost_graph_raises_format_error(
    cost_graph_file: Path, workdir: Path, data: st.DataObject
) -> None:
    """``CostGraph.load``, and ``tensortorrent cost-graph``, which plans what it loaded."""
    bad = write(workdir / "bad-cost-graph.json", data.draw(damaged(cost_graph_file.read_bytes())))
    outcome(lambda: CostGraph.load(bad), CostGraphFormatError)
    with quiet():
        assert cli.main(["cost-graph", str(bad), "--profile", "nominal"]) in (0, 1)


# -- offload manifests ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offload_dir(workdir: Path) -> Path:
    """An offload store of two tensors."""
    directory = workdir / "offload"
    OffloadStore(directory).write({"a": torch.randn(8), "b": torch.arange(6).reshape(2, 3)})
    assert OffloadStore(directory).verify() == []
    return directory


@given(data=st.data())
@settings(BOUNDED, max_examples=400)
def test_a_damaged_offload_manifest_raises_offload_error(
    offload_dir: Path, data: st.DataObject
) -> None:
    """``OffloadStore.locations`` (unchecked and checked) and ``verify``."""
    manifest = offload_dir / "manifest.json"
    valid = manifest.read_bytes()
    store = OffloadStore(offload_dir)
    try:
        manifest.write_bytes(data.draw(damaged(valid)))
        outcome(lambda: store.locations(verify=False), OffloadError)
        outcome(store.verify, OffloadError)
        outcome(store.locations, OffloadError)
    finally:
        manifest.write_bytes(valid)
