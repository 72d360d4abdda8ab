"""`ironserve lab reset HOST` refuses what it cannot do before touching anything (its real run: tests/e2e,
test_rank_group_lab.py's rebuilt host)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ironserve_lab import cli


@pytest.mark.parametrize("command", [["ironserve_lab"], ["ironserve", "lab"]])
def test_reset_is_a_lab_subcommand(command):
    """The lab's own module and the product's command line (which adds the lab's parser where it is installed)."""
    out = subprocess.run([sys.executable, "-m", *command, "reset", "--help"], capture_output=True, text=True)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "a host rebuilt from scratch" in text and "--limit HOST" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="lab commands need root")
def test_reset_of_an_unknown_host_names_the_lab_hosts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IRONSERVE_LAB_DIR", str(tmp_path))  # a lab of its own: never the shared one
    assert cli.main(["reset", "lab9"]) == 1
    err = capsys.readouterr().err
    assert "no lab host 'lab9'" in err and "the lab is down" in err


def test_up_finds_the_labs_host_assets_and_brings_up_the_hosts_asked_for(monkeypatch):
    """`lab up` reaches the bring-up with the hosts asked for (the package carries its host assets; recorded here,
    nothing started)."""
    from ironserve_lab import cluster

    asked = []
    monkeypatch.setattr(cluster, "up", lambda *args: asked.append(args))
    assert cli.main(["up", "--nodes", "2", "--hardware", "cpu-lab"]) == 0
    assert cli.main(["up", "--nodes", "1", "--for", "tiny", "--for", "deploys/tiny.py"]) == 0
    assert cli.main(["up", "--nodes", "5", "--hardware", "gb200", "--plus", "rtx6000-pro-maxq:2"]) == 0
    assert asked == [
        (2, "cpu-lab", (), ()),
        (1, None, ("tiny", "deploys/tiny.py"), ()),
        (5, "gb200", (), (("rtx6000-pro-maxq", 2),)),
    ]
