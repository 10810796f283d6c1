"""Benchmarks refuse a busy host, or mark every figure of a run they were told to make anyway."""

from __future__ import annotations

import pytest

from bench import quiet


@pytest.fixture
def busy_host(monkeypatch):
    monkeypatch.setattr(quiet.os, "getloadavg", lambda: (3.7, 3.1, 2.9))
    monkeypatch.setattr(quiet, "SAMPLE_S", 0.01)


def test_a_busy_host_is_refused_with_its_numbers(busy_host) -> None:
    with pytest.raises(SystemExit, match=r"the host is busy \(load 3.70 > 1.5"):
        quiet.check_host(allow_busy=False)


def test_a_run_made_anyway_is_marked_busy(busy_host) -> None:
    host = quiet.check_host(allow_busy=True)
    assert host.busy and host.report()["busy_machine"] is True and host.report()["load_before"] == [3.7, 3.1, 2.9]


def test_a_quiet_host_is_not_marked(monkeypatch) -> None:
    monkeypatch.setattr(quiet.os, "getloadavg", lambda: (0.2, 0.3, 0.4))
    monkeypatch.setattr(quiet, "host_cpu", iter([(100.0, 1000.0), (100.1, 1002.0)]).__next__)
    monkeypatch.setattr(quiet, "SAMPLE_S", 0.01)
    assert not quiet.check_host(allow_busy=False).busy
