"""Ports the test servers get: below the kernel's ephemeral range, in the worker's own thousand, never
one that something holds, and not the same twice in a row of a thousand."""

from __future__ import annotations

import socket

from tests.support.servers import process
from tests.support.servers.process import HOST, free_port


def ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        return int(ranges.read().split()[0])


def test_ports_lie_in_this_workers_range_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    assert all(port in process._PORTS for port in ports)
    assert process._PORTS.stop <= ephemeral_low()


def test_each_worker_has_its_own_thousand(monkeypatch) -> None:
    ranges = []
    for worker in ("gw0", "gw1", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ranges.append(set(process._worker_ports()))
    assert not (ranges[0] & ranges[1]) and not (ranges[1] & ranges[2]) and not (ranges[0] & ranges[2])


def test_a_port_something_holds_is_skipped(monkeypatch) -> None:
    held, spare = free_port(), free_port()  # the spare is free (held+1 could be a server of this worker's)
    with socket.socket() as holder:
        holder.bind((HOST, held))
        holder.listen()
        monkeypatch.setattr(process, "_next_port", iter([held, spare]))
        assert free_port() == spare
