"""The lab's docker stand-in, image registry and stand-in checkpoints, offline (no root, no lab).

The docker stand-in (ironserve/lab/assets/docker.py) runs here as a plain script with its state in
tmp_path; it is fed the exact command strings of the roles' facts and operations, and their answers go
through the facts' own process(). The real-parser probe inside a lab host is in test_lab_docker.py.
"""

from __future__ import annotations

import dataclasses

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.lab import cluster, images, standins
from ironserve.render import model_path_on, render
from ironserve.spec import DockerRuntime
from pyinfra.api import StringCommand
from ironserve.units import exec_argv, sha256_text
from roles import container_runtime as cr
from roles import gpu_clocks, model_weights as mw, sglang_service as ss, uv_env

ASSETS = Path(standins.__file__).parent / "assets"
PARSE_CHECK = Path(__file__).resolve().parents[2] / "files" / "bin" / "ironserve-parse-check"
GLM = "glm5-nvfp4-mtp-rtx6000-tp8"
GLM_DIGEST = "sha256:426d1fa4b10722688678b99d817c2caa92a89eed4a8ee2927ab44a848bbe77df"


def _docker_recipes():
    """The stand-in's docker recipes: the accelerator ones (cpu-lab's tiny-cpu-docker runs on the real engine)."""
    return [r for r in catalogue.catalogue().values() if isinstance(r.runtime, DockerRuntime) and r.hardware != ["cpu-lab"]]


def test_the_real_engines_recipes_are_not_the_stand_ins():
    ids = {r.id for r in catalogue.catalogue().values() if isinstance(r.runtime, DockerRuntime)}
    assert "tiny-cpu-docker" in ids
    table = images.registry_table()
    assert not any("tiny-cpu-docker" in e["recipes"] for e in table["images"])


# ---------------------------------------------------------------- registry table and checkpoints


def test_registry_holds_every_docker_recipe_image_at_a_stable_digest():
    table = images.registry_table()
    assert table == images.registry_table()  # deterministic
    by_ref = {(e["repo"], t): e for e in table["images"] for t in e["tags"]}
    for recipe in _docker_recipes():
        repo, tag = images.split_image(recipe.runtime.image)
        entry = by_ref[(repo, tag)]
        assert recipe.id in entry["recipes"]
        assert entry["digest"] == (recipe.runtime.digest or images.lab_digest(recipe.runtime.image))
        assert entry["parser_version"] == recipe.engine.check_version
        if entry["parser_version"]:
            assert table["parsers"][entry["parser_version"]].endswith(f"sglang-parsers/{entry['parser_version']}")
    assert images.lab_digest("lmsysorg/sglang:dev-cu13") == \
        "sha256:d7d7fb522a685c1e8fcda0487ee712f59b506e7f61e4ad1bee4ceff91125341e"
    assert by_ref[("lmsysorg/sglang", "glm5-blackwell")]["digest"] == GLM_DIGEST
    assert "0.5.9" in images.versions_for(table, "rtx6000-pro-maxq")
    assert images.versions_for(table, "cpu-lab") == []


def test_wheelhouse_and_repo_carry_what_the_roles_install():
    assert cluster.UV_VERSION == uv_env.UV_VERSION
    assert f"nvidia-ml-py=={gpu_clocks.NVIDIA_ML_PY_VERSION}" in cluster.DEFAULT_WHEELS
    assert {"python3-venv", "curl", "gpg", "ca-certificates", "python3-pip"} <= set(cluster.DEFAULT_DEBS)


def test_interpreter_binds_never_cover_a_system_tree(tmp_path):
    assert images.interpreter_binds("/usr") == [] and images.interpreter_binds("/") == []
    prefix = tmp_path / "pyenv" / "3.11.7"
    (prefix / "bin").mkdir(parents=True)
    assert images.interpreter_binds(str(prefix)) == [str(prefix)]
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = {prefix}/bin\nversion_info = 3.11.7\n")
    assert images._venv_prefix(venv) == str(prefix)


def test_stand_in_checkpoints_verify_like_the_role_checks_them(tmp_path):
    models = images.publish_models(tmp_path)
    recipes = _docker_recipes()
    host = InventoryHost("lab1", {"model_root": images.MODEL_ROOT})
    for recipe in recipes:
        path = model_path_on(recipe, host)
        name = path.rsplit("/", 1)[-1]
        assert models[name]["path"] == path and recipe.id in models[name]["recipes"]
    for name in models:
        local = tmp_path / "models" / name
        check = subprocess.run(["sha256sum", "-c", mw.MANIFEST], cwd=local, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        index = json.loads((local / mw.INDEX).read_text())
        assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                             "model-00002-of-00002.safetensors"]
        out = subprocess.run(["sh", "-c", mw.ModelCheckpoint().command(path=str(local))], capture_output=True,
                             text=True)
        state = mw.ModelCheckpoint().process(out.stdout.splitlines())
        assert mw.checkpoint_problems(state) == [] and state["shards"] == 2 and state["manifest_stamp"]
    stamp = {p: p.stat().st_mtime for p in (tmp_path / "models").rglob("*")}
    images.publish_models(tmp_path)  # regenerating keeps size and mtime: the role's verified stamp holds
    assert {p: p.stat().st_mtime for p in (tmp_path / "models").rglob("*")} == stamp


# ---------------------------------------------------------------- the docker stand-in, run here


class Docker:
    def __init__(self, tmp_path: Path, registry: dict):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        shutil.copy(ASSETS / "docker.py", self.bin / "docker")
        (self.bin / "docker").chmod(0o755)
        reg = tmp_path / "registry.json"
        reg.write_text(json.dumps(registry))
        lib = tmp_path / "lib"
        lib.mkdir()
        shutil.copy(ASSETS / "docker_image_patch.py", lib / "sitecustomize.py")
        self.env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "IRONLAB_DOCKER_REGISTRY": str(reg),
                    "IRONLAB_DOCKER_STATE": str(tmp_path / "state"), "IRONLAB_DOCKER_SOCK": "none",
                    "IRONLAB_DOCKER_LIB": str(lib)}
        self.tmp = tmp_path

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(self.bin / "docker"), *args], capture_output=True, text=True,
                              env=self.env)

    def sh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=self.env)

    def fact(self, fact, **kwargs):
        out = self.sh(fact.command(**kwargs))
        return fact.process(out.stdout.splitlines())


def _fake_parser_venv(tmp_path: Path) -> Path:
    """A stand-in 'parser venv': python3 with a tiny fake sglang whose parser knows three flags."""
    venv = tmp_path / "fake-parser"
    pkg = venv / "site" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (venv / "site" / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(p):\n"
        "        p.add_argument('--model-path', required=True)\n        p.add_argument('--tp-size', type=int)\n"
        "        p.add_argument('--trust-remote-code', action='store_true')\n"
        "        p.add_argument('--tool-call-parser', choices=['glm47', 'qwen3_coder'])\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_text(
        f"#!/bin/sh\nPYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{venv / 'site'} exec {sys.executable} \"$@\"\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / "ironserve-env.json").write_text("{}")
    return venv


@pytest.fixture
def docker(tmp_path):
    table = images.registry_table()
    venv = str(_fake_parser_venv(tmp_path))
    table["parsers"] = {v: venv for v in table["parsers"]}
    return Docker(tmp_path, table)


def test_pull_by_tag_and_by_digest_is_stable(docker):
    first = docker("pull", "lmsysorg/sglang:dev-cu13")
    assert first.returncode == 0 and "Status: Downloaded newer image for lmsysorg/sglang:dev-cu13" in first.stdout
    digest = images.lab_digest("lmsysorg/sglang:dev-cu13")
    assert f"Digest: {digest}" in first.stdout and first.stdout.endswith("docker.io/lmsysorg/sglang:dev-cu13\n")
    again = docker("pull", "lmsysorg/sglang:dev-cu13")
    assert "Image is up to date" in again.stdout and f"Digest: {digest}" in again.stdout
    image_id = docker("image", "inspect", "--format", "{{.Id}}", "lmsysorg/sglang:dev-cu13").stdout
    by_digest = docker("pull", f"lmsysorg/sglang@{digest}")
    assert by_digest.returncode == 0 and by_digest.stdout.endswith(f"docker.io/lmsysorg/sglang@{digest}\n")
    assert docker("image", "inspect", "--format", "{{.Id}}", f"lmsysorg/sglang@{digest}").stdout == image_id
    assert docker.fact(cr.DockerImageDigests(), ref="lmsysorg/sglang:dev-cu13") == [f"lmsysorg/sglang@{digest}"]
    # the digest pinned by the glm5 recipes, pulled by digest only: no tag
    assert docker.fact(cr.DockerImageDigests(), ref=f"lmsysorg/sglang@{GLM_DIGEST}") is None
    assert docker("pull", f"lmsysorg/sglang@{GLM_DIGEST}").returncode == 0
    assert docker.fact(cr.DockerImageDigests(), ref=f"lmsysorg/sglang@{GLM_DIGEST}") == [
        f"lmsysorg/sglang@{GLM_DIGEST}"]
    assert docker("image", "inspect", "lmsysorg/sglang:glm5-blackwell").returncode == 1


@pytest.mark.parametrize("ref", ["lmsysorg/sglang:no-such-tag", f"someone/else@{GLM_DIGEST}", "ubuntu"])
def test_pull_of_an_image_outside_the_lab_registry_fails_like_a_real_pull(docker, ref):
    out = docker("pull", ref)
    assert out.returncode == 1 and "manifest unknown" in out.stderr
    assert docker("image", "inspect", ref).returncode == 1


def test_inspect_answers_the_templates_the_roles_use(docker):
    missing = docker("image", "inspect", "--format", "{{json .RepoDigests}}", "lmsysorg/sglang:dev-cu13")
    assert missing.returncode == 1 and "No such image: lmsysorg/sglang:dev-cu13" in missing.stderr
    assert docker.fact(cr.DockerImageLabel(), ref="lmsysorg/sglang:dev-cu13", label=cr.DOCKERFILE_LABEL) is None
    docker("pull", "lmsysorg/sglang:dev-cu13")
    label = docker("image", "inspect", "--format", '{{index .Config.Labels "x.y"}}', "lmsysorg/sglang:dev-cu13")
    assert label.stdout == "<no value>\n"
    assert docker.fact(cr.DockerImageLabel(), ref="lmsysorg/sglang:dev-cu13", label=cr.DOCKERFILE_LABEL) == ""
    lines = docker("image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}",
                   "lmsysorg/sglang:dev-cu13").stdout
    assert lines.splitlines()[0] == f"lmsysorg/sglang@{images.lab_digest('lmsysorg/sglang:dev-cu13')}"
    raw = json.loads(docker("image", "inspect", "lmsysorg/sglang:dev-cu13").stdout)
    assert raw[0]["RepoTags"] == ["lmsysorg/sglang:dev-cu13"] and raw[0]["Id"].startswith("sha256:")
    assert docker("image", "inspect", "--format", "{{if .RepoTags}}{{len .RepoTags}}{{else}}none{{end}} "
                  "{{.Os | upper}} {{join .RepoTags \",\"}}", "lmsysorg/sglang:dev-cu13").stdout == \
        "1 LINUX lmsysorg/sglang:dev-cu13\n"


def test_first_tag_resolution_of_the_role_writes_the_lock(docker, tmp_path):
    """roles/container_runtime.image_pinned for a tag-only recipe: its shell commands, run against the stand-in."""
    recipe = catalogue.get_recipe("kimi-k2.5-rtx6000-tp8")
    lock = cr.lock_path(recipe.id)
    state = FakeState()
    host = create_host(state, facts={"container_runtime.ImageLock": {f"path={lock}": None}})
    with ctx_state.use(state), ctx_host.use(host):
        commands = [str(c) for c in cr.image_pinned._inner(image=recipe.runtime.image, recipe_id=recipe.id)
                    if isinstance(c, (str, StringCommand))]  # a pull is a LongCommand (progress lines)
    etc = tmp_path / "etc-ironserve"
    for command in commands:
        out = docker.sh(command.replace("/etc/ironserve", str(etc)))
        assert out.returncode == 0, out.stderr
    digest = images.lab_digest(recipe.runtime.image)
    assert json.loads((etc / f"{recipe.id}.lock.json").read_text()) == {
        "digest": digest, "image": recipe.runtime.image, "recipe": recipe.id}
    assert f"lmsysorg/sglang@{digest}" in docker.fact(cr.DockerImageDigests(), ref=recipe.runtime.image)
    # a retag by the role (local tag moved away) puts it back on the locked digest
    assert docker("tag", f"lmsysorg/sglang@{GLM_DIGEST}", recipe.runtime.image).returncode == 1  # not pulled
    docker("pull", f"lmsysorg/sglang@{GLM_DIGEST}")
    assert docker("tag", f"lmsysorg/sglang@{GLM_DIGEST}", recipe.runtime.image).returncode == 0
    assert docker.fact(cr.DockerImageDigests(), ref=recipe.runtime.image) == [f"lmsysorg/sglang@{GLM_DIGEST}"]
    assert docker("tag", f"lmsysorg/sglang@{digest}", recipe.runtime.image).returncode == 0
    assert docker.fact(cr.DockerImageDigests(), ref=recipe.runtime.image) == [f"lmsysorg/sglang@{digest}"]


def test_build_records_label_and_parent_and_runs_nothing(docker, tmp_path):
    recipe = catalogue.get_recipe(GLM)
    runtime = recipe.runtime
    text = cr.dockerfile_text(recipe.id, runtime.pinned_ref, list(runtime.patches), "http://10.213.7.1:8780/simple/")
    folder = tmp_path / "images" / recipe.id
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(text)
    tag = f"ironserve/{recipe.id}:derived"
    assert docker.fact(cr.DockerImageLabel(), ref=tag, label=cr.DOCKERFILE_LABEL) is None
    build = ["docker", "build", "--network", "host", "--label", f"{cr.DOCKERFILE_LABEL}={sha256_text(text)}",
             "-t", tag, "-f", str(folder / "Dockerfile"), "--build-arg", "PIP_INDEX_URL=http://10.213.7.1:8780/simple/",
             str(folder)]
    out = docker.sh(shlex.join(build))
    assert out.returncode == 0, out.stderr
    assert "RUN recorded, NOT executed" in out.stdout and f"Successfully tagged {tag}" in out.stdout
    assert docker.fact(cr.DockerImageLabel(), ref=tag, label=cr.DOCKERFILE_LABEL) == sha256_text(text)
    base_id = docker("image", "inspect", "--format", "{{.Id}}", runtime.pinned_ref).stdout.strip()
    assert docker("image", "inspect", "--format", "{{.Parent}}", tag).stdout.strip() == base_id
    built_id = docker("image", "inspect", "--format", "{{.Id}}", tag).stdout
    assert docker.sh(shlex.join(build)).returncode == 0  # same Dockerfile and labels: the same image
    assert docker("image", "inspect", "--format", "{{.Id}}", tag).stdout == built_id
    assert len(docker("images", "-q").stdout.split()) == 2


def test_parse_probe_runs_the_parser_the_image_stands_for(docker, tmp_path):
    recipe = catalogue.get_recipe(GLM)
    docker("pull", recipe.runtime.pinned_ref)
    proc = render(recipe).processes[0]
    probe = ss.parse_check_argv(recipe, proc)
    probe = [a.replace(ss.PARSE_CHECK, str(PARSE_CHECK)) for a in probe]
    probe[probe.index(f"ironserve/{recipe.id}:derived")] = recipe.runtime.pinned_ref
    fake_ok = probe[:probe.index("--") + 1] + ["--model-path", "/m", "--tp-size", "8"]
    ok = docker.sh(shlex.join(fake_ok))
    assert ok.returncode == 0, ok.stderr
    bad = docker.sh(shlex.join(fake_ok + ["--no-such-flag"]))
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-flag" in bad.stderr
    # the image era's own flags (images.IMAGE_EXTRAS), which its PyPI parser lacks, parse as in the real image
    extras = fake_ok + ["--enable-pcie-oneshot-allreduce", "--tool-call-parser", "qwen3"]
    assert docker.sh(shlex.join(extras)).returncode == 0
    wrong = docker.sh(shlex.join(fake_ok + ["--tool-call-parser", "qwen4"]))
    assert wrong.returncode == 2 and "invalid choice: 'qwen4'" in wrong.stderr
    assert docker("ps", "-aq").stdout == ""  # --rm: nothing left


def test_engine_launch_and_hub_download_fail_clearly(docker, tmp_path):
    recipe = catalogue.get_recipe(GLM)
    docker("pull", recipe.runtime.pinned_ref)
    proc = render(recipe).processes[0]
    # --gpus: no CDI spec here (CDI access: tests/e2e/test_deploy_glm5_gb200_lab.py)
    proc = dataclasses.replace(proc, gpu_access="dev-char")
    argv = exec_argv(recipe, proc)
    argv[argv.index(f"ironserve/{recipe.id}:derived")] = recipe.runtime.pinned_ref
    env_file = tmp_path / "unit.env"
    env_file.write_text("# comment\nNCCL_IB_DISABLE=1\nHF_TOKEN=secret\n")
    argv[argv.index("--env-file") + 1] = str(env_file)
    served = docker(*argv[1:])
    assert served.returncode == 1 and "stand-in image cannot serve" in served.stderr
    assert docker("stop", "--time", "60", proc.unit).returncode == 1  # --rm: no container left
    assert "No such container" in docker("stop", "--time", "60", proc.unit).stderr
    command = mw.download_command(recipe.model.hub_id, "/srv/models/x", image=recipe.runtime.pinned_ref)
    download = docker.sh(command.replace("mkdir -p /srv/models/x && ", ""))
    assert download.returncode == 1 and "no Hugging Face hub in the lab" in download.stderr
    assert recipe.model.hub_id in download.stderr


def test_container_inspect_answers_the_drift_fact(docker, tmp_path):
    image = "lmsysorg/sglang:dev-cu13"
    assert docker.fact(cr.ContainerConfig(), container="unit1", image=image) is None
    docker("pull", image)
    env_file = tmp_path / "unit.env"
    env_file.write_text("NCCL_IB_DISABLE=1\nHF_TOKEN=secret\n")
    created = docker("create", "--name", "unit1", "--env-file", str(env_file), "--gpus", "all", "--ipc=host",
                     "--network=host", image, "python3", "-m", "sglang.launch_server", "--model-path", "/m")
    assert created.returncode == 0, created.stderr
    have = docker.fact(cr.ContainerConfig(), container="unit1", image=image)
    assert have["image"] == image and have["running"] is False
    assert have["image_id"] == have["want_image_id"] and have["image_id"].startswith("sha256:")
    assert have["cmd"] == ["python3", "-m", "sglang.launch_server", "--model-path", "/m"]
    assert have["env_names"] == ["HF_TOKEN", "NCCL_IB_DISABLE", "PATH"]
    clash = docker("run", "--name", "unit1", image, "python3", "-c", "pass")
    assert clash.returncode == 125 and "is already in use" in clash.stderr
    assert docker("stop", "--time", "60", "unit1").stdout == "unit1\n"
    assert docker("rm", "unit1").returncode == 0 and docker("rm", "unit1").returncode == 1
    kept = docker("run", "--name", "unit2", image, "python3", "-m", "sglang.launch_server")
    assert kept.returncode == 1  # without --rm the exited container stays, like docker's
    assert docker("container", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", "unit2").stdout == \
        "exited 1\n"


def test_an_image_without_a_pypi_parser_says_so(tmp_path):
    table = images.registry_table()
    table["images"][0]["parser_version"] = None
    d = Docker(tmp_path, table)
    ref = f"{table['images'][0]['repo']}@{table['images'][0]['digest']}"
    assert d("pull", ref).returncode == 0
    out = d("run", "--rm", "--entrypoint", "python3", ref, "-c", "pass")
    assert out.returncode == 125 and "not a PyPI release" in out.stderr


def test_daemon_must_run_and_daemon_json_must_be_valid(docker, tmp_path):
    down = subprocess.run([sys.executable, str(docker.bin / "docker"), "images"], capture_output=True, text=True,
                          env={**docker.env, "IRONLAB_DOCKER_SOCK": str(tmp_path / "docker.sock")})
    assert down.returncode == 1 and "Is the docker daemon running?" in down.stderr
    assert docker("--version").stdout.startswith("Docker version 28.5.1")
    bad = tmp_path / "daemon.json"
    bad.write_text('{"runtimes": {"nvidia": {"args": []}}}')
    out = subprocess.run([sys.executable, str(ASSETS / "dockerd.py"), f"--config-file={bad}"], capture_output=True,
                         text=True, timeout=10)
    assert out.returncode == 1 and "runtime nvidia: path is required" in out.stderr
    bad.write_text("{nope")
    out = subprocess.run([sys.executable, str(ASSETS / "dockerd.py"), f"--config-file={bad}"], capture_output=True,
                         text=True, timeout=10)
    assert out.returncode == 1 and "unable to configure the Docker daemon" in out.stderr


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb")
def test_docker_packages(tmp_path):
    debs = {d.name.split("_")[0]: d for d in standins.build_docker_debs(tmp_path)}
    assert set(debs) == {"docker-ce", "docker-ce-cli", "containerd.io"}
    listing = subprocess.run(["dpkg-deb", "-c", str(debs["docker-ce-cli"])], capture_output=True, text=True).stdout
    assert "./usr/bin/docker" in listing
    control = subprocess.run(["dpkg-deb", "-f", str(debs["docker-ce"])], capture_output=True, text=True).stdout
    assert "Depends: containerd.io (>= 1.7.27), docker-ce-cli, python3" in control
    assert "Version: 5:28.5.1-1~debian.12~bookworm" in control
