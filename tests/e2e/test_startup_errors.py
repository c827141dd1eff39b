"""Start-up failures end with an actionable one-line error and exit code 2, not a traceback; a
network nobody joins (a second one started next to a live run, say) is said in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, Processes, gossamer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # the waits follow progress: this is the last resort


def run_toml(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text('[run]\nname = "x"\n')
    return path


def test_http_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = gossamer(["orchestrator", "-c", str(run_toml(tmp_path)), "--new_swarm", *LOOPBACK,
                           "--http_port", str(port), "--identity_path", str(tmp_path / "id.pem")])
    assert result.returncode == 2, result.stderr
    assert f"port {port}" in result.stderr and "--http_port" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_bootstrap_peer(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    maddr = f"/ip4/127.0.0.1/tcp/{port}/p2p/12D3KooWPaxWkuFbGNDZWTN9Bwz5T8uvTCLVNcR8V5zgF8Xv13N3"
    result = gossamer(["peer", "--run", "x@0123456789abcdef", "--initial_peers", maddr, *LOOPBACK,
                       "--identity_path", str(tmp_path / "id.pem")])
    assert result.returncode == 2, result.stderr
    assert "error:" in result.stderr and maddr in result.stderr and "Traceback" not in result.stderr


def test_malformed_initial_peer(tmp_path: Path) -> None:
    result = gossamer(["peer", "--run", "x@0123456789abcdef", "--initial_peers", "1.2.3.4:5",
                       "--identity_path", str(tmp_path / "id.pem")])
    assert result.returncode == 2
    assert "initial_peers" in result.stderr and "Traceback" not in result.stderr


def test_world_readable_identity_is_refused(tmp_path: Path) -> None:
    assert gossamer(["identity", "new", "--identity_path", str(tmp_path / "id.pem")]).returncode == 0
    (tmp_path / "id.pem").chmod(0o644)
    result = gossamer(["identity", "show", "--identity_path", str(tmp_path / "id.pem")])
    assert result.returncode == 2 and "chmod 600" in result.stderr


def test_a_network_nobody_joins_says_how_to_join_it_and_that_it_may_be_a_second_one(processes: Processes,
                                                                                     tmp_path: Path) -> None:
    orch = processes.start(["orchestrator", "-c", str(run_toml(tmp_path)), "--new_swarm", "--events", *LOOPBACK,
                            "--join_timeout_s", "2", "--identity_path", str(tmp_path / "id.pem")],
                           log_path=tmp_path / "orch.log")
    ready = orch.wait_ready()
    log = orch.wait_log(lambda text: "no other peer has appeared" in text)  # due 2 s after start-up
    line = next(line for line in log.splitlines() if "no other peer has appeared in 2 s" in line)
    assert f"--run {ready['run_id']}" in line and "--initial_peers" in line, line
    assert "second network that will never meet it" in line, line
    assert orch.proc.poll() is None, "it is a warning: the orchestrator goes on waiting for peers"
