"""The corpus runs offline, and only its quick subset runs unless asked for.

Plain ``pytest`` (CI, ``make check``) runs the entries marked ``quick`` in the registry;
``pytest -m corpus`` (``make corpus``) runs the whole corpus, and ``-m corpus -k NAME``
one entry of it.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

# nothing is downloaded: every model is built from a config
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "corpus" in (config.option.markexpr or ""):
        return  # the whole corpus was asked for
    here = os.path.dirname(__file__)
    full_only = [
        item
        for item in items
        if item.get_closest_marker("corpus_full") is not None and str(item.path).startswith(here)
    ]
    if full_only:
        config.hook.pytest_deselected(items=full_only)
        dropped = {id(item) for item in full_only}
        items[:] = [item for item in items if id(item) not in dropped]


# what each corpus test's outcomes are counted as: its id's last part is the budget, and
# for generate() its second the cache (ids ``{entry}-{cache}-{budget}``)
_CASE_KEYS = {
    "test_entry_matches_eager": "forward budget={budget}",
    "test_entry_streams_from_disk_within_a_host_budget": (
        "forward from disk budget=third of host RAM"
    ),
    "test_entry_in_bfloat16_matches_eager": "forward in bfloat16 budget={budget}",
    "test_entry_in_channels_last_matches_eager": "forward in channels_last budget={budget}",
    "test_entry_returning_every_layers_outputs_matches_eager": (
        "forward with every layer's outputs budget={budget}"
    ),
    "test_entry_converted_after_compiling_matches_eager": (
        "converted after compiling budget={budget}"
    ),
    "test_entry_with_hooks_added_after_compiling_matches_eager": (
        "hooks added after compiling budget={budget}"
    ),
    "test_entry_compiled_block_by_block_matches_eager": ("compiled block by block budget={budget}"),
    "test_entry_quantized_with_torchao_matches_eager": ("quantized with torchao budget={budget}"),
    "test_entry_built_under_inference_mode_matches_eager": (
        "built under inference_mode budget={budget}"
    ),
    "test_entry_with_an_adapter_merged_after_compiling_matches_eager": (
        "adapter merged after compiling budget={budget}"
    ),
    "test_entry_built_on_meta_runs_from_the_checkpoint_it_saved": (
        "built on meta, from its saved checkpoint budget={budget}"
    ),
    "test_entry_segments_run_on_cuda": "cuda placement budget={budget}",
    "test_generate_matches_eager": "generate budget={budget} cache={cache}",
    "test_generate_streams_from_disk_within_a_host_budget": "generate budget=disk cache={cache}",
    "test_generate_by_sampling_and_beam_search_matches_eager": (
        "generate by {cache} budget={budget}"
    ),
    "test_generate_segments_run_on_cuda": (
        "cuda placement of generate budget={budget} cache={cache}"
    ),
    "test_generate_through_the_compiled_module_is_explained_saved_and_replayed": (
        "generate through tt.compile, saved and replayed budget={budget}"
    ),
    "test_a_model_used_several_ways_in_one_process_matches_eager": (
        "used several ways budget={budget}"
    ),
    "test_a_pipeline_with_compiled_modules_matches_eager": "diffusers pipeline budget={budget}",
    "test_generate_with_a_saved_plan_serves_prompts_of_any_length": (
        "generate from a saved plan, prompts of any length budget={budget} cache={cache}"
    ),
}


def _case_key(nodeid: str) -> str:
    """``forward budget=third`` or ``generate budget=none cache=static`` for a corpus test id."""
    test, _, case = nodeid.rpartition("::")[2].partition("[")
    parts = case.rstrip("]").split("-")
    key = _CASE_KEYS.get(test, f"{test} budget={{budget}}")
    return key.format(budget=parts[-1], cache=parts[1] if len(parts) > 1 else "")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Counts of the corpus's outcomes per test and budget (``make corpus`` prints them)."""
    here = os.path.dirname(__file__)
    counts: dict[str, Counter[str]] = {}
    for outcome in ("passed", "failed", "error", "xfailed", "xpassed"):
        seen = set()
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            path = str(getattr(report, "fspath", ""))
            if "[" not in nodeid or nodeid in seen or not os.path.abspath(path).startswith(here):
                continue
            seen.add(nodeid)
            counts.setdefault(_case_key(nodeid), Counter())[outcome] += 1
    if counts:
        terminalreporter.section("corpus outcomes")
        for key in sorted(counts):
            line = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts[key].items()))
            terminalreporter.write_line(f"{key}: {line}")
