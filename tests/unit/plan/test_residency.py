"""One residency per parameter, built once from the native plan's arrays."""

from __future__ import annotations

import pytest

from tensortorrent_dynamo.plan.residency import Residency, Tier, residencies


def test_residencies_name_devices_and_tiers_and_carry_rows() -> None:
    got = residencies(
        ["cpu", "cuda:0"],
        param_device=[1, 0, 1],
        param_streamed=[True, False, False],
        param_home=["host", "disk", "disk"],
        rows=[None, (0, 16), None],
    )
    assert got == (
        Residency("cuda:0", streams=True, tier=Tier.HOST),
        Residency("cpu", streams=False, tier=Tier.DISK, rows=(0, 16)),
        Residency("cuda:0", streams=False, tier=Tier.DISK),
    )


@pytest.mark.parametrize(
    ("residency", "keeps_copy", "reads_from_disk", "pinned"),
    [
        # used on the host, its bytes in RAM: the model's tensor itself, no copy
        (Residency("cpu", False, Tier.HOST), False, False, False),
        # kept on an accelerator: a resident copy there
        (Residency("cuda:0", False, Tier.HOST), True, False, False),
        # streamed from host RAM to CUDA: from pinned memory
        (Residency("cuda:0", True, Tier.HOST), False, False, True),
        (Residency("virtual:0", True, Tier.HOST), False, False, False),
        # its tier is disk, kept in RAM: read once into a resident copy
        (
            Residency("cpu", False, Tier.DISK),
            True,
            False,
            False,
        ),
        # read from disk on each run
        (Residency("cpu", True, Tier.DISK), False, True, False),
    ],
)
def test_what_a_residency_implies(
    residency: Residency, keeps_copy: bool, reads_from_disk: bool, pinned: bool
) -> None:
    assert residency.keeps_copy is keeps_copy
    assert residency.reads_from_disk is reads_from_disk
    assert residency.pinned is pinned
    assert residency.on_disk is (residency.tier is Tier.DISK)


def test_an_unknown_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="tape"):
        residencies(["cpu"], [0], [False], ["tape"])
