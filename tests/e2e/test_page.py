"""The swarm page (``GET /``) in a real headless browser: an orchestrator and two learners; once a
learner has finished a round, Chromium loads the orchestrator's page, which must show every live
peer and at least one point of the loss curve, drawn from the peers' own ``/status``. A screenshot
is saved (``GOSSAMER_SCREENSHOT=PATH`` copies it there: docs/swarm-page.png is made this way).
Skips, saying so, where Chromium is not installed (``apt-get install -y chromium``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, Processes, wait_until

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# the waits follow progress: the limit is the last resort
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200),
              pytest.mark.skipif(BROWSER is None, reason="Chromium is not installed (apt-get install -y chromium)")]

RUN = """
[run]
name = "page"
protocol = "diloco"
heartbeat_s = 1.0
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
[hyper]
rounds = 50
batch_size = 8
eval_batches = 2
min_learners = 2
w1_grace_s = 1.0
w2_deadline_s = 10.0
[hyper.diloco]
inner_steps = 8
"""


def browser(*args: str, profile: Path, timeout_s: float = 300) -> str:
    result = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout_s)
    return result.stdout


def drawn(dom: str) -> bool:
    """Whether the page shows the three peers and at least two points of the loss curve."""
    peers = re.search(r'data-peers="(\d+)"', dom)
    points = re.search(r'data-loss-points="(\d+)"', dom)
    return bool(peers and points and int(peers.group(1)) == 3 and int(points.group(1)) >= 2)


def test_the_swarm_page_shows_the_peers_and_the_loss_curve(processes: Processes, tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    orch = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(tmp_path / "owner.pem"), "--public_name", "owner"],
                           log_path=tmp_path / "owner.log")
    ready = orch.wait_ready()
    for i in range(2):
        processes.start(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles", "learner",
                         "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(tmp_path / f"l{i}.pem"),
                         "--public_name", f"learner-{i}", "--checkpoint_dir", str(tmp_path / "ckpt")],
                        log_path=tmp_path / f"l{i}.log")
    everyone = processes.started
    for proc in everyone[1:]:
        proc.wait_event(lambda e: e["event"] == "diloco.round" and e["round"] >= 1, also=everyone)
    url = f"http://{ready['http']}/"

    # each load is one full render of what the peers report, loaded again while they make progress
    dom = wait_until(lambda: browser("--dump-dom", "--virtual-time-budget=10000", url, profile=tmp_path / "profile"),
                     drawn, watching=everyone)
    assert 'data-peers="3"' in dom, dom[-3000:]
    assert int(re.search(r'data-loss-points="(\d+)"', dom).group(1)) >= 2, dom[-3000:]
    assert "learner-0" in dom and "learner-1" in dom and "owner" in dom
    assert ready["run_id"] in dom and "gossamer peer --run" in dom and "class=\"loss-point\"" in dom

    shot = tmp_path / "swarm-page.png"
    browser(f"--screenshot={shot}", "--window-size=1100,1500", "--virtual-time-budget=10000", url,
            profile=tmp_path / "profile")
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("GOSSAMER_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["GOSSAMER_SCREENSHOT"])
