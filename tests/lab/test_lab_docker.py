"""The docker deploy path's stand-ins on a lab host: Docker from the lab repo, the lab image registry, the real
SGLang parser behind `docker run` (the roles' parse probe), refusals to serve and to download, and the stand-in
checkpoints on every host. Runs on the session lab (conftest.py), on lab2; the roles' own fact and operation
command strings are sent to the host, so what is tested is what a deploy runs.
"""

from __future__ import annotations

import dataclasses

import base64
import json
import runpy
import shlex
from pathlib import Path

import pytest

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.lab import images
from ironserve.render import render
from ironserve.units import exec_argv, sha256_text
from roles import container_runtime as cr
from roles import model_weights as mw
from roles import sglang_service as ss

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
APT = "sudo DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0"
GLM = "glm5-nvfp4-mtp-rtx6000-tp8"


def sudo(lab, host, command: str, check: bool = True, timeout: float = 120):
    return lab.ssh(host, f"sudo sh -c {shlex.quote(command)}", check=check, timeout=timeout)


def fact(lab, host, the_fact, **kwargs):
    out = sudo(lab, host, the_fact.command(**kwargs))
    return the_fact.process(out.stdout.splitlines())


@pytest.fixture(scope="module")
def docker_host(lab):
    host = lab.hosts[1]
    lab.ssh(host, f"{APT} update && {APT} install docker-ce docker-ce-cli containerd.io nvidia-container-toolkit",
            timeout=300)
    # the probe script where roles/sglang_service.py installs it
    blob = base64.b64encode((ROOT / "files/bin/ironserve-parse-check").read_bytes()).decode()
    sudo(lab, host, f"install -d {ss.LIB_DIR} && echo {blob} | base64 -d > {ss.PARSE_CHECK} && "
                    f"chmod 755 {ss.PARSE_CHECK}")
    return host


def lab_inventory() -> list[InventoryHost]:
    """The hosts as inventories/lab.py gives them (model_root, nic, ssh_hostname)."""
    return [InventoryHost(n, d) for n, d in runpy.run_path(str(ROOT / "inventories/lab.py"))["lab_hosts"]]


def test_docker_from_the_lab_repo_starts_and_takes_the_nvidia_runtime(lab, docker_host):
    h = docker_host
    assert lab.ssh(h, "systemctl is-active docker containerd").stdout.split() == ["active", "active"]
    assert lab.ssh(h, "systemctl is-enabled docker").stdout.strip() == "enabled"
    assert lab.ssh(h, "docker --version").stdout.startswith("Docker version 28.5.1")
    denied = lab.ssh(h, "docker images", check=False)  # not root, not in the docker group
    assert denied.returncode == 1 and "permission denied while trying to connect" in denied.stderr
    assert fact(lab, h, cr.DockerRuntimes()) == []
    sudo(lab, h, "nvidia-ctk runtime configure --runtime=docker && systemctl restart docker")
    assert fact(lab, h, cr.DockerRuntimes()) == ["nvidia"]
    assert "nvidia" in sudo(lab, h, "docker info --format '{{json .Runtimes}}'").stdout
    assert lab.ssh(h, "systemctl is-active docker").stdout.strip() == "active"
    assert lab.ssh(h, "systemctl is-system-running").stdout.strip() == "running"
    sudo(lab, h, "systemctl stop docker")
    down = sudo(lab, h, "docker images", check=False)
    assert down.returncode == 1 and "Is the docker daemon running?" in down.stderr
    sudo(lab, h, "systemctl start docker")


def test_pull_by_tag_and_by_digest_is_stable(lab, docker_host):
    h = docker_host
    image = "lmsysorg/sglang:dev-cu13"
    digest = images.lab_digest(image)
    assert fact(lab, h, cr.DockerImageDigests(), ref=image) is None
    first = sudo(lab, h, f"docker pull {image}").stdout
    again = sudo(lab, h, f"docker pull {image}").stdout
    assert f"Digest: {digest}" in first and f"Digest: {digest}" in again and "Image is up to date" in again
    assert fact(lab, h, cr.DockerImageDigests(), ref=image) == [f"lmsysorg/sglang@{digest}"]
    image_id = sudo(lab, h, f"docker image inspect --format '{{{{.Id}}}}' {image}").stdout
    sudo(lab, h, f"docker pull lmsysorg/sglang@{digest}")
    assert sudo(lab, h, f"docker image inspect --format '{{{{.Id}}}}' lmsysorg/sglang@{digest}").stdout == image_id
    listed = sudo(lab, h, f"docker image inspect --format '{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}' "
                          f"{image}").stdout
    assert listed.splitlines()[0] == f"lmsysorg/sglang@{digest}"
    pinned = catalogue.get_recipe(GLM).runtime.pinned_ref
    sudo(lab, h, f"docker pull {pinned}")
    assert fact(lab, h, cr.DockerImageDigests(), ref=pinned) == [pinned]
    unknown = sudo(lab, h, "docker pull lmsysorg/sglang:not-in-the-lab", check=False)
    assert unknown.returncode == 1 and "manifest unknown" in unknown.stderr


def test_derived_image_build_like_the_role(lab, docker_host):
    h = docker_host
    recipe = catalogue.get_recipe(GLM)
    runtime = recipe.runtime
    text = cr.dockerfile_text(recipe.id, runtime.pinned_ref, list(runtime.patches), lab.status["pip_index"])
    path = cr.dockerfile_path(recipe.id)
    blob = base64.b64encode(text.encode()).decode()
    sudo(lab, h, f"mkdir -p {shlex.quote(str(Path(path).parent))} && echo {blob} | base64 -d > {path}")
    tag = f"ironserve/{recipe.id}:derived"
    assert fact(lab, h, cr.DockerImageLabel(), ref=tag, label=cr.DOCKERFILE_LABEL) is None
    build = ["docker", "build", "--network", "host", "--label", f"{cr.DOCKERFILE_LABEL}={sha256_text(text)}",
             "-t", tag, "-f", path, "--build-arg", f"PIP_INDEX_URL={lab.status['pip_index']}", str(Path(path).parent)]
    out = sudo(lab, h, shlex.join(build)).stdout
    assert "RUN recorded, NOT executed" in out and f"Successfully tagged {tag}" in out
    assert fact(lab, h, cr.DockerImageLabel(), ref=tag, label=cr.DOCKERFILE_LABEL) == sha256_text(text)
    assert fact(lab, h, cr.DockerImageLabel(), ref=runtime.pinned_ref, label=cr.DOCKERFILE_LABEL) == ""


def test_parse_probe_runs_the_real_sglang_parser_of_the_image(lab, docker_host):
    """The glm5 recipe's seed-style argv, rendered for the lab inventory, parsed by `docker run` of its image."""
    h = docker_host
    recipe = catalogue.get_recipe(GLM)
    parser = lab.status["parsers"].get(recipe.engine.check_version) or {}
    if not parser.get("built"):
        pytest.skip(f"the sglang {recipe.engine.check_version} parser venv could not be built on this machine "
                    "(see the `lab up` warning)")
    proc = render(recipe, lab_inventory()).processes[0]
    assert "--model-path" in proc.argv and f"{images.MODEL_ROOT}/GLM-5-NVFP4-MTP" in proc.argv
    probe = ss.parse_check_argv(recipe, proc)
    assert probe[:2] == ["docker", "run"] and f"ironserve/{recipe.id}:derived" in probe  # built by the test above
    # the seed argv, one with an unknown flag, one with a bad choice: three probes at once (each imports SGLang)
    argvs = [probe, probe + ["--no-such-flag", "1"], probe + ["--kv-cache-dtype", "fp3"]]
    script = " ".join(f"( {ss.ParseCheck().command(probe=shlex.join(a))} ) > /tmp/ironlab-probe-{n} 2>&1 &"
                      for n, a in enumerate(argvs))
    script += " wait; " + " ".join(f"cat /tmp/ironlab-probe-{n}; echo ironlab-probe-end;" for n in range(len(argvs)))
    outputs = sudo(lab, h, script, timeout=300).stdout.split("ironlab-probe-end\n")
    ok, bad, choice = (ss.ParseCheck().process(o.splitlines()) for o in outputs[:3])
    assert ok["rc"] == 0, ok["output"]
    assert bad["rc"] == 2
    assert "sglang.launch_server: error: unrecognized arguments: --no-such-flag 1" in bad["output"]
    # a bad choice, with the real parser's own list of choices
    assert choice["rc"] == 2 and "argument --kv-cache-dtype: invalid choice: 'fp3'" in choice["output"]


def test_serving_and_hub_downloads_are_refused_clearly(lab, docker_host):
    h = docker_host
    recipe = catalogue.get_recipe(GLM)
    proc = render(recipe, lab_inventory()).processes[0]
    # --gpus: no CDI spec on this driverless host (CDI access: tests/e2e/test_deploy_glm5_gb200_lab.py)
    proc = dataclasses.replace(proc, gpu_access="dev-char")
    sudo(lab, h, f"mkdir -p /etc/ironserve && printf 'NCCL_IB_DISABLE=1\\n' > /etc/ironserve/{proc.unit}.env")
    served = sudo(lab, h, shlex.join(exec_argv(recipe, proc)), check=False)  # the unit's ExecStart
    assert served.returncode == 1 and "stand-in image cannot serve" in served.stderr
    assert fact(lab, h, cr.ContainerConfig(), container=proc.unit, image=f"ironserve/{recipe.id}:derived") is None
    stop = sudo(lab, h, f"/usr/bin/docker stop --time 60 {proc.unit}", check=False)  # the unit's ExecStop
    assert stop.returncode == 1 and f"No such container: {proc.unit}" in stop.stderr
    download = mw.download_command(recipe.model.hub_id, "/var/tmp/ironlab-download", image=ss.image_ref(recipe))
    refused = sudo(lab, h, download, check=False)
    assert refused.returncode == 1 and "no Hugging Face hub in the lab" in refused.stderr


def test_stand_in_checkpoints_on_every_host(lab):
    assert lab.status["model_root"] == images.MODEL_ROOT
    models = lab.status["models"]
    for recipe in (catalogue.get_recipe(GLM), catalogue.get_recipe("kimi-k2.5-rtx6000-tp8")):
        assert any(recipe.id in m["recipes"] for m in models.values())
    glm = models["GLM-5-NVFP4-MTP"]["path"]
    for h in lab.hosts:
        checks = " && ".join(f"(cd {shlex.quote(m['path'])} && sha256sum -c {mw.MANIFEST})" for m in models.values())
        assert lab.ssh(h, checks).stdout.count(": OK") == 4 * len(models)
        state = mw.ModelCheckpoint().process(lab.ssh(h, mw.ModelCheckpoint().command(path=glm)).stdout.splitlines())
        assert mw.checkpoint_problems(state) == [] and state["shards"] == 2 and state["manifest_stamp"]
        index = json.loads(lab.ssh(h, f"cat {glm}/{mw.INDEX}").stdout)
        assert len(set(index["weight_map"].values())) == 2
        assert sudo(lab, h, f"touch {images.MODEL_ROOT}/x", check=False).returncode != 0  # read-only, shared
