"""bench/worker_ab.py's variants: a label, settings by their ROLLOUTS_ names, or another checkout."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.worker_ab import main, parse_variant

REPO = Path(__file__).resolve().parents[2]


def test_a_variant_takes_settings_and_a_checkout() -> None:
    variant = parse_variant(f"old:WORKER__SLOT_SUPPLIER=fixed,tree={REPO},WORKER__MAX_LOOP_LAG_S=0.5")
    assert variant.label == "old"
    assert variant.env == {"ROLLOUTS_WORKER__SLOT_SUPPLIER": "fixed", "ROLLOUTS_WORKER__MAX_LOOP_LAG_S": "0.5"}
    assert variant.tree == REPO
    assert parse_variant("new") == parse_variant("new:")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (":WORKER__SLOT_SUPPLIER=fixed", "needs a label"),
        ("a:WORKER__SLOT_SUPPLIER", "is not NAME=VALUE"),
        ("a:tree=/nonexistent/checkout", "holds no worker.py"),
    ],
)
def test_a_malformed_variant_is_refused_with_why(spec: str, problem: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        parse_variant(spec)


def test_two_variants_may_not_share_a_label(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["same", "same:WORKER__SLOT_SUPPLIER=fixed"])
    assert "variant labels must differ" in capsys.readouterr().err
