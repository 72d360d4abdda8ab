"""The audit's reads that one tool run answers for several checks: a host's image checks share one `docker image
inspect`, the hold check reads dpkg's selection. Each command is run for real by sh here, with a stand-in `docker` or
`dpkg-query` on PATH printing what the real one prints; the checks' results are the evaluators' own."""

from __future__ import annotations

import os
import stat

import pytest
import testinfra

from ironserve.audit.checks import Check
from ironserve.audit.evaluate import evaluate
from ironserve.audit.runner import plan_checks
from roles.nvidia_driver import hold_check
from roles.recipe_image import digest_present, image_names_read

BASE = "lmsysorg/sglang@sha256:" + "a" * 64
DERIVED = "ironserve/r:derived"


def _tool(tmp_path, name: str, body: str) -> None:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """A local testinfra host whose PATH starts with tmp_path (where the stand-ins are written)."""
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return testinfra.get_host("local://")


# docker image inspect --format '<tags, then repo digests, a line each>' REF...: each image found, in the order
# asked; a missing one said on stderr, exit 1 (what docker does)
DOCKER = """
shift 4  # image inspect --format FORMAT
rc=0
for ref in "$@"; do
  case "$ref" in
    lmsysorg/sglang@sha256:*) [ -n "$HAVE_BASE" ] && echo "$ref" || { echo "Error: No such image: $ref" >&2; rc=1; } ;;
    ironserve/r:derived) [ -n "$HAVE_DERIVED" ] && echo "$ref" || { echo "Error: No such image: $ref" >&2; rc=1; } ;;
    *) echo "Error: No such image: $ref" >&2; rc=1 ;;
  esac
done
exit $rc
"""


def _image_checks() -> list[Check]:
    read = image_names_read([BASE, DERIVED])
    base = digest_present("image", BASE, read)
    return [
        Check("h", base.id, base.kind, base.expected, {"cmd": base.cmd, "item": base.item}),
        Check("h", f"derived-image:{DERIVED}", "listed", "present", {"cmd": read, "item": DERIVED}),
    ]


@pytest.mark.parametrize(
    "have, results",
    [
        ({"HAVE_BASE": "1", "HAVE_DERIVED": "1"}, [(True, "present"), (True, "present")]),
        ({"HAVE_DERIVED": "1"}, [(False, "missing"), (True, "present")]),
        ({"HAVE_BASE": "1"}, [(True, "present"), (False, "missing")]),
        ({}, [(False, "missing"), (False, "missing")]),
    ],
)
def test_one_docker_run_answers_each_image_check(tmp_path, on_path, monkeypatch, have, results):
    _tool(tmp_path, "docker", DOCKER)
    for name in ("HAVE_BASE", "HAVE_DERIVED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in have.items():
        monkeypatch.setenv(name, value)
    checks = _image_checks()
    assert checks[0].params["cmd"] == checks[1].params["cmd"]  # one command: the snapshot asks it once
    assert [evaluate(on_path, c) for c in checks] == results


def test_the_pinned_digest_is_found_whatever_repository_docker_names_it_by(tmp_path, on_path):
    # the digest check never read the repository: docker.io/ names the same image as the short name does
    _tool(tmp_path, "docker", 'echo "docker.io/lmsysorg/sglang@sha256:' + "a" * 64 + '"')
    (check,) = _image_checks()[:1]
    assert evaluate(on_path, check) == (True, "present")


def test_a_glm5_hosts_image_checks_share_one_docker_run():
    checks, _ = plan_checks("inventories/rtx6000.py", "deploys/glm5.py")
    mine = [c for c in checks if c.host == checks[0].host and "image" in c.id]
    assert {c.id.partition(":")[0] for c in mine} == {"image", "derived-image"}
    assert len({c.params["cmd"] for c in mine}) == 1 and mine[0].params["cmd"].startswith("docker image inspect ")


@pytest.mark.parametrize(
    "printed, rc, found",
    [
        ("hold ok installed", 0, "hold ok installed"),
        ("install ok installed", 0, "install ok installed"),
        ("hold ok half-installed", 0, "hold ok half-installed"),
        ("", 1, "rc=1"),
    ],
)
def test_the_hold_is_dpkgs_selection(tmp_path, on_path, printed, rc, found):
    _tool(tmp_path, "dpkg-query", f'[ "$4" = nvidia-open-580 ] || exit 2; printf %s "{printed}"; exit {rc}')
    item = hold_check("nvidia-open-580")
    # the very question testinfra's is_installed asks: one answer serves both checks (and folds with the others)
    assert item.cmd == on_path.backend.quote("dpkg-query -f '${Status}' -W %s", "nvidia-open-580")
    result = evaluate(on_path, Check("h", item.id, item.kind, item.expected, {"cmd": item.cmd}))
    assert result == (found == "hold ok installed", found)
