"""The text of explain() and of the generated schedule, pinned with expecttest."""

from __future__ import annotations

import re

import expecttest
import torch

import tensortorrent as tt
from tests.models import mlp


def _compiled() -> tt.CompiledModule:
    model, x = mlp(32, 3), torch.randn(4, 32)
    return tt.compile(
        model,
        example_inputs=(x,),
        budgets={"virtual:0": "9KiB", "cpu": "1GiB"},
        virtual_devices={"virtual:0": {"flops": "2T", "bandwidth": "16GB"}},
        compiler="eager",
    )


class TestExplain(expecttest.TestCase):
    def test_explain_table(self) -> None:
        torch._dynamo.reset()
        compiled = _compiled()
        self.assertExpectedInline(
            compiled.explain(),
            """""",
        )

    def test_schedule_code(self) -> None:
        torch._dynamo.reset()
        compiled = _compiled()
        code = compiled.graphs[0].module.code
        body = [line.strip() for line in code.splitlines() if "tensortorrent_dynamo" in line]
        calls = [re.sub(r";.*", "", line) for line in body]
        self.assertExpectedInline("\n".join(calls), """""")
