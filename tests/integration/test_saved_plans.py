"""Plans saved, reloaded in a fresh process, refused or re-planned when stale."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import tensortorrent as tt
from tensortorrent_dynamo.profile.resolve import nominal_profile
from tests.models import TwoBreaks, mlp

OPTIONS = {
    "budgets": {"virtual:0": "48KiB", "cpu": "1GiB"},
    "virtual_devices": {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}},
    "compiler": "eager",
}

FRESH = textwrap.dedent(
    """
    import json, sys, torch
    import tensortorrent as tt
    from tests.models import TwoBreaks
    model, x = TwoBreaks(64, depth=4), torch.ones(4, 64)
    compiled = tt.load(sys.argv[1], model, example_inputs=(x,))
    with torch.no_grad():
        out = compiled(x)
    print(json.dumps({"hashes": compiled.plan_hashes(), "out": out.sum().item()}))
    """
)


def test_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    model, x = TwoBreaks(64, depth=4), torch.ones(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **OPTIONS)
    path = tmp_path / "plan.json"
    compiled.save(path)
    data = json.loads(path.read_text())
    assert data["format_version"] == 2 and len(data["graphs"]) == 3
    assert {"placement", "residency", "segments", "graph_hash", "decisions"} <= set(
        data["graphs"][0]
    )
    result = subprocess.run(
        [sys.executable, "-c", FRESH, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    reloaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert reloaded["hashes"] == compiled.plan_hashes()
    with torch.no_grad():
        assert reloaded["out"] == pytest.approx(compiled(x).sum().item(), rel=1e-6)


def test_a_saved_plan_is_replayed_not_searched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plan.json"
    model, x = mlp(64, 4), torch.randn(4, 64)
    saved = tt.compile(model, example_inputs=(x,), **OPTIONS)
    saved.save(path)
    hashes = saved.plan_hashes()
    torch._dynamo.reset()
    with caplog.at_level("INFO", logger="tensortorrent_dynamo"):
        compiled = tt.load(path, model, example_inputs=(x,))
    assert compiled.plan_hashes() == hashes
    assert f"taken from the saved plan {path}, search skipped" in caplog.text
    (graph,) = compiled.graphs
    assert graph.plan.native.stop_reason.startswith("replayed")


def test_a_plan_its_decisions_do_not_give_is_refused(tmp_path: Path) -> None:
    """Decisions that replay to another hash, and a search that does not find the saved
    hash either: the file no longer describes a plan this planner makes."""
    path = tmp_path / "plan.json"
    model, x = mlp(64, 4), torch.randn(4, 64)
    tt.compile(model, example_inputs=(x,), **OPTIONS).save(path)
    data = json.loads(path.read_text())
    data["graphs"][0]["plan_hash"] = data["graphs"][0]["decisions"]["plan_hash"] = "0" * 16
    path.write_text(json.dumps(data))
    torch._dynamo.reset()
    with pytest.raises(tt.StalePlanError, match="no longer give plan 0000000000000000"):
        tt.load(path, model, example_inputs=(x,))


def test_a_plan_is_made_again_with_the_figures_it_was_saved_with(tmp_path: Path) -> None:
    """A plan saved with a profile's figures, loaded on the same hardware after they were
    measured again (other figures, which make another plan): the plans are made again with
    the figures the file keeps, and are the saved ones (before, the load was refused as
    "planned with other device rates"); explain() says where the figures came from."""
    figures = tmp_path / "profile.json"
    figures.write_text(nominal_profile().to_json())
    options = {**OPTIONS, "profile": str(figures)}
    model, x = mlp(64, 4), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **options)
    path = tmp_path / "plan.json"
    compiled.save(path)
    saved = compiled.plan_hashes()

    again = json.loads(figures.read_text())
    cpu = next(d for d in again["devices"] if d["name"] == "cpu")
    cpu["matmul"]["float32"]["value"] /= 3  # measured again: other figures
    figures.write_text(json.dumps(again))
    torch._dynamo.reset()
    remeasured = tt.compile(mlp(64, 4), example_inputs=(x,), **options)
    assert remeasured.plan_hashes() != saved, "the figures measured again make another plan"
    torch._dynamo.reset()
    loaded = tt.load(path, mlp(64, 4), example_inputs=(x,), replan="error")
    assert loaded.plan_hashes() == saved
    assert f"saved with the plan {path}" in loaded.explain()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


def test_a_changed_graph_is_refused_or_replanned(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    tt.compile(mlp(64, 4), example_inputs=(torch.randn(4, 64),), **OPTIONS).save(path)
    torch._dynamo.reset()
    other, x = mlp(64, 5), torch.randn(4, 64)  # one more layer: another graph
    with pytest.raises(tt.StalePlanError, match="no plan for this graph"):
        tt.load(path, other, example_inputs=(x,))
    torch._dynamo.reset()
    with pytest.warns(tt.TensorTorrentWarning, match="planned again"):
        compiled = tt.load(path, other, example_inputs=(x,), replan="auto")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), other(x))


def test_graphs_a_loaded_model_traces_that_were_never_saved_are_planned_or_refused(
    tmp_path: Path,
) -> None:
    """Saved after calls of one batch alone, the file has the model's graph for that shape:
    a loaded model called with a second batch traces the graph for any batch, which it
    lacks. It is planned when traced, with a warning saying why (explain() says it was
    searched), and every call equals eager's; with replan="error" it is refused, naming the
    default that plans it. Saved again, the file has it: loaded again, nothing is planned
    anew. A model whose weights changed is refused whatever replan says, naming the weight."""
    batches = [torch.randn(n, 64) for n in (4, 8, 16, 4)]
    model = mlp(64, 3)
    with torch.no_grad():
        expected = [model(x) for x in batches]
    compiled = tt.compile(model, **OPTIONS)
    with torch.no_grad():
        compiled(batches[0])
    path = tmp_path / "plan.json"
    compiled.save(path)

    torch._dynamo.reset()
    loaded = tt.load(path, mlp(64, 3))
    unsaved = pytest.warns(tt.TensorTorrentWarning, match="did not trace this graph.*Planned now")
    with torch.no_grad():
        torch.testing.assert_close(loaded(batches[1]), expected[1])  # replayed at batch 8
        with unsaved:  # and again for batch 4, a range of sizes not planned for
            torch.testing.assert_close(loaded(batches[2]), expected[2])
            torch.testing.assert_close(loaded(batches[3]), expected[3])
    assert len(loaded.plan_hashes()) == 3
    explained = f"searched, not replayed from the saved plan {path}: it has no plan for this graph"
    assert explained in loaded.explain()
    again = tmp_path / "again.json"
    loaded.save(again)

    torch._dynamo.reset()
    strict = tt.load(path, mlp(64, 3), replan="error")
    with torch.no_grad():
        strict(batches[1])
        with pytest.raises(tt.UnsavedGraphError, match=r'did not trace.*replan="new"'):
            strict(batches[2])

    torch._dynamo.reset()
    strict = tt.load(again, mlp(64, 3), replan="error")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", tt.TensorTorrentWarning)
        for x, y in zip(batches[1:], expected[1:], strict=True):
            torch.testing.assert_close(strict(x), y)

    torch._dynamo.reset()
    wider = tt.load(path, nn.Sequential(nn.Linear(64, 80), nn.ReLU(), nn.Linear(80, 64)).eval())
    with torch.no_grad(), pytest.raises(tt.StalePlanError, match=r"'0\.weight' is .*80, 64"):
        wider(batches[1])


def test_calls_in_another_order_than_saved_replay_the_graphs_saved_at_other_sizes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Dynamo traces the first call for its shapes alone and a second call of other shapes
    for any: saved after batch 4 then batch 8, a model loaded and called with batch 8 first
    traces the batch-4 graph at batch 8. The file has that graph at other sizes: its
    decisions are replayed at these (said in the log), and the calls equal eager's. Where
    they do not fit at these sizes, the graph is planned now, with a warning saying why, or
    refused saying so with replan="error"."""
    small, large = torch.randn(4, 64), torch.randn(8, 64)
    model = mlp(64, 3)
    with torch.no_grad():
        expected = model(small), model(large)
    compiled = tt.compile(model, **OPTIONS)
    with torch.no_grad():
        compiled(small)
        compiled(large)
    path = tmp_path / "plan.json"
    compiled.save(path)
    saved = compiled.plan_hashes()
    assert len(saved) == 2

    torch._dynamo.reset()
    loaded = tt.load(path, mlp(64, 3))
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="tensortorrent_dynamo"):
        torch.testing.assert_close(loaded(large), expected[1])
        torch.testing.assert_close(loaded(small), expected[0])
    assert any("at other sizes" in r.getMessage() for r in caplog.records)
    assert loaded.plan_hashes()[0] != saved[0]
    assert f"the decisions of the saved plan {path} (for this graph at other sizes)" in (
        loaded.explain()
    )

    torch._dynamo.reset()
    loaded = tt.load(path, mlp(64, 3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(small), expected[0])
        torch.testing.assert_close(loaded(large), expected[1])
    assert loaded.plan_hashes() == saved
    assert loaded.explain().count(f"the decisions of the saved plan {path}):") == 2

    # a batch whose activations do not fit beside the weights the saved decisions keep:
    # the file has no plan for it at these sizes, planned now as one it lacks, or refused
    huge = torch.randn(256, 64)
    torch._dynamo.reset()
    loaded = tt.load(path, mlp(64, 3), replan="error")
    refused = pytest.raises(tt.StalePlanError, match=r"(?s)at other sizes.*replan=\"new\"")
    with torch.no_grad(), refused:
        loaded(huge)

    torch._dynamo.reset()
    loaded = tt.load(path, mlp(64, 3))
    with torch.no_grad(), pytest.warns(tt.TensorTorrentWarning, match="Planned now"):
        torch.testing.assert_close(loaded(huge), model(huge))


@pytest.mark.parametrize(
    ("field", "change", "refused"),
    [
        ("cpu_cores", lambda n: n + 64, True),
        ("ram_total_bytes", lambda n: n - n // 10, True),
        # another machine of the same kind: the kernel reports some MiB more or less
        ("ram_total_bytes", lambda n: n - n // 200, False),
    ],
)
def test_other_hardware_is_refused(
    tmp_path: Path, field: str, change: Callable[[int], int], refused: bool
) -> None:
    path = tmp_path / "plan.json"
    model, x = mlp(64, 4), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **OPTIONS)
    compiled.save(path)
    saved = compiled.plan_hashes()
    data = json.loads(path.read_text())
    data["hardware"][field] = change(data["hardware"][field])
    path.write_text(json.dumps(data))
    torch._dynamo.reset()
    if refused:
        with pytest.raises(tt.StalePlanError, match=rf"other hardware.*{field}"):
            tt.load(path, model, example_inputs=(x,))
    else:
        loaded = tt.load(path, model, example_inputs=(x,), replan="error")
        assert loaded.plan_hashes() == saved
        assert f"saved with the plan {path}" in loaded.explain()


def test_unknown_format_version_is_refused_with_the_version(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    model, x = mlp(64, 2), torch.randn(4, 64)
    tt.compile(model, example_inputs=(x,), **OPTIONS).save(path)
    data = json.loads(path.read_text())
    data["format_version"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(tt.PlanFormatError, match="version 7"):
        tt.load(path, model)


def test_explain_command_prints_the_saved_table(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    compiled = tt.compile(mlp(64, 4), example_inputs=(torch.randn(4, 64),), **OPTIONS)
    compiled.save(path)
    result = subprocess.run(
        [sys.executable, "-m", "tensortorrent_dynamo.cli", "explain", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert compiled.explain() in result.stdout
