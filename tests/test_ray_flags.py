"""The Ray flags without a cluster: Ray missing, --workers without --ray, an address nothing answers on. These run
whether or not Ray is installed (the one that needs it skips)."""

from __future__ import annotations

import socket
import sys

import pytest


def test_ray_not_installed_exits_2_naming_the_install(runner, corpus_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    res = runner("index", corpus_file, "-o", tmp_path / "idx", "--model", "unused", "--ray", "local")
    assert res.exit_code == 2
    assert "pip install 'retrctl[ray]'" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "idx").exists()


def test_workers_without_ray_is_a_usage_error(runner, corpus_file, tmp_path):
    res = runner("index", corpus_file, "-o", tmp_path / "idx", "--model", "unused", "--workers", 2)
    assert res.exit_code == 2 and "need --ray" in res.stderr


def test_unreachable_address_exits_2_at_once(runner, corpus_file, tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = runner("index", corpus_file, "-o", tmp_path / "idx", "--model", "unused", "--ray", f"127.0.0.1:{port}")
    assert res.exit_code == 2
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in res.stderr and "ray start --head" in res.stderr
    assert len([line for line in res.stderr.splitlines() if "Error" in line]) == 1


def test_ray_workers_share_their_node_in_the_memory_plan(monkeypatch):
    from retrctl import memory

    monkeypatch.delenv("RETRCTL_LOCAL_WORKERS", raising=False)
    for key in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(key, raising=False)
    alone = memory.available("cpu")
    monkeypatch.setenv("RETRCTL_LOCAL_WORKERS", "4")
    assert memory.local_processes() == 4
    shared = memory.available("cpu")
    assert "/ 4 local processes" in shared.source and shared.free <= alone.free // 3
