"""Pure helpers and host scripts of the runtime roles (recipe_image, container_drift, uv_env, model_weights, sglang_service,
router, launch): offline, no pyinfra run. Fixture cases of the facts/operations live in tests/facts and
tests/operations."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import OperationError
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from ironserve import catalogue
from ironserve.inventory import InventoryHost
from ironserve.render import render
from ironserve.units import KEY_LAUNCHER, container_command, deliberate, exec_argv, sha256_text, unit_files, venv_path
from roles import container_drift, health, launch, recipe_image
from roles import model_weights as mw
from roles import sglang_service as ss
from roles import uv_env as uv
from roles.common import changed, deb822_source

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "files" / "bin"
DIGEST = "sha256:426d1fa4b10722688678b99d817c2caa92a89eed4a8ee2927ab44a848bbe77df"


def _recipe(rid):
    return catalogue.get_recipe(rid)


# --------------------------------------------------------------------------- recipe image, container drift


def test_dockerfile_is_pinned_base_plus_patches_verbatim():
    recipe = _recipe("glm5-nvfp4-mtp-rtx6000-tp8")
    text = recipe_image.dockerfile_text(recipe.id, recipe.runtime.pinned_ref, recipe.runtime.patches)
    lines = text.splitlines()
    assert lines[1] == f"FROM lmsysorg/sglang@{DIGEST}"
    assert lines[2:] == recipe.runtime.patches
    assert "transformers==5.2.0" in text and "DEEPGEMM_SCALE_UE8M0 = False" in text
    with_mirror = recipe_image.dockerfile_text(
        recipe.id, recipe.runtime.pinned_ref, recipe.runtime.patches, "http://m/simple"
    )
    assert "ARG PIP_INDEX_URL" in with_mirror and sha256_text(with_mirror) != sha256_text(text)


def test_split_image_keeps_registry_ports():
    assert recipe_image.split_image("lmsysorg/sglang:dev-cu13") == ("lmsysorg/sglang", "dev-cu13")
    assert recipe_image.split_image("reg.lab:5000/sglang") == ("reg.lab:5000/sglang", "latest")
    assert recipe_image.split_image(f"lmsysorg/sglang@{DIGEST}") == ("lmsysorg/sglang", None)


def test_first_resolution_writes_the_lock_text(tmp_path):
    """Run the op's shell against a stand-in docker: the lock file is exactly lock_text()."""
    fake = tmp_path / "bin"
    fake.mkdir()
    digest = "sha256:" + "2" * 64
    (fake / "docker").write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        # stand-in: `docker image inspect --format '{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}' REF`
        printf 'other/repo@sha256:{"9" * 64}\\nlmsysorg/sglang@{digest}\\n'
        """)
    )
    (fake / "docker").chmod(0o755)
    state = FakeState()
    host = create_host(state, facts={"recipe_image.ImageLock": {"path=/etc/ironserve/r.lock.json": None}})
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(recipe_image.image_pinned._inner(image="lmsysorg/sglang:dev-cu13", recipe_id="r"))
    record = str(commands[1]).replace("/etc/ironserve", str(tmp_path / "etc"))
    out = subprocess.run(
        ["sh", "-c", record], capture_output=True, text=True, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "etc" / "r.lock.json").read_text() == recipe_image.lock_text(
        "r", "lmsysorg/sglang:dev-cu13", digest
    )
    assert f"runtime.digest: {digest}" in out.stdout


def test_deb822_sources():
    flat = deb822_source("http://10.0.0.1/apt", "/", "stable", None, True)
    assert "Components" not in flat and "Trusted: yes" in flat
    docker = deb822_source(
        "https://download.docker.com/linux/ubuntu", "noble", "stable", "/etc/apt/keyrings/docker.asc", False
    )
    assert "Components: stable" in docker and "Signed-By: /etc/apt/keyrings/docker.asc" in docker


def test_drift_reasons():
    have = {"image": "img", "image_id": "a", "want_image_id": "a", "cmd": ["x"], "env_names": ["A", "PATH"]}
    assert container_drift.drift(have, "img", ["x"], ["A"]) == []
    assert container_drift.drift({**have, "want_image_id": "b"}, "img", ["x"], ["A"]) == [
        "the image was rebuilt or re-pulled since the container started"
    ]
    assert container_drift.drift(have, "img2", ["y"], ["A", "B"]) == [
        "image img != img2",
        "command line differs",
        "env lacks B",
    ]


# --------------------------------------------------------------------------- uv


def test_a_new_package_set_is_a_new_venv_beside_the_live_one():
    recipe = catalogue.get_recipe("tiny-cpu")
    bumped = recipe.model_copy(
        update={
            "runtime": recipe.runtime.model_copy(
                update={
                    "packages": [p if not p.startswith("numpy==") else "numpy==2.3.4" for p in recipe.runtime.packages]
                }
            )
        }
    )
    assert venv_path(recipe).startswith("/opt/ironserve/venvs/runtime-") and venv_path(recipe) == venv_path(recipe)
    assert venv_path(bumped) != venv_path(recipe)  # never an upgrade in place under a running unit
    hosts = [
        InventoryHost(n, {"hardware": "cpu-lab"} | ({"ironserve_role": "router"} if n == "r0" else {}))
        for n in ("r0", "n0", "n1")
    ]
    assert exec_argv(bumped, render(bumped, hosts).processes[0])[0].startswith(venv_path(bumped) + "/bin/")


def test_requirements_diff_only_changed_pins():
    installed = {"sglang": "0.5.23", "sglang-router": "0.3.2"}
    assert uv.requirements_diff(["sglang==0.5.23", "sglang-router==0.3.2"], installed) == []
    assert uv.requirements_diff(["SGLang==0.5.24", "sglang_router==0.3.2", "sgl-kernel[x]==0.3.1"], installed) == [
        "SGLang==0.5.24",
        "sgl-kernel[x]==0.3.1",
    ]


def test_index_args_mirror_overrides_everything():
    runtime = _recipe("minimax-m2.5-nvfp4-rtx6000-tp2").runtime
    assert uv.index_args(runtime, "http://10.213.7.1:8780/simple/") == ["--index-url", "http://10.213.7.1:8780/simple/"]
    named = {
        "sglang-cu129": "http://mirror/sgl129/",
        "sglang-cu130": "http://mirror/sgl130/",
        "pytorch-cu130": "http://mirror/torch130/",
    }
    args = uv.index_args(runtime, None, named)
    assert args[:2] == ["--index-url", "http://mirror/sgl129/"]
    assert "https://pypi.org/simple" in args  # index:pypi as an extra index is PyPI itself
    assert args[-2:] == ["--index-strategy", "unsafe-best-match"]
    with pytest.raises(KeyError):
        uv.index_args(runtime, None, {})


def test_requirements_text_records_indexes():
    runtime = _recipe("tiny-cpu").runtime
    text = uv.requirements_text(runtime, ["--index-url", "http://m/simple"])
    assert "tiny-cpu" not in text  # the runtime's record, whichever recipe of that runtime wrote it
    assert text.splitlines()[1] == "# --index-url http://m/simple"
    assert text.splitlines()[2:] == runtime.packages


def test_recipes_of_one_runtime_share_its_venv():
    """The nine GLM-5.1 Atlas variants differ in topology and flags, not in packages: one venv per host, which a
    switch between them neither reinstalls nor byte-compiles again; another runtime gets its own."""
    atlas = [r for r in catalogue.catalogue().values() if r.id.startswith("glm5.1-w4a8-a3-")]
    assert len(atlas) == 9 and len({venv_path(r) for r in atlas}) == 1
    assert len({venv_path(catalogue.get_recipe(r)) for r in ("tiny-cpu", "tiny-cpu-tp2")}) == 1
    others = {
        venv_path(catalogue.get_recipe(r))
        for r in ("tiny-cpu", "llama3-8b-multinode-tp4", "minimax-m2.5-nvfp4-rtx6000-tp2", atlas[0].id)
    }
    assert len(others) == 4


# --------------------------------------------------------------------------- model weights


def test_checkpoint_problems_name_what_is_missing():
    state = {"exists": True, "config": False, "missing": ["a.safetensors"], "empty": ["b.safetensors"]}
    assert mw.checkpoint_problems(state) == [
        "config.json is missing",
        "shard a.safetensors is missing",
        "shard b.safetensors is empty",
    ]
    assert mw.checkpoint_problems(None) == ["the directory does not exist"]


def test_download_keeps_the_token_off_argv():
    argv, env = mw.hf_download("festr2/GLM-5-NVFP4-MTP", "/mnt/m", venv="/opt/ironserve/venvs/r", token=True)
    assert env["HF_TOKEN_PATH"] == "/etc/ironserve/hf_token" and env["HF_HUB_ENABLE_HF_TRANSFER"] == "0"
    assert argv[-3:] == ["festr2/GLM-5-NVFP4-MTP", "--local-dir", "/mnt/m"]  # the helper adds --revision COMMIT
    assert not any("token" in a.lower() and "path" not in a.lower() for a in argv)
    docker, denv = mw.hf_download("x/y", "/mnt/m", image="img@sha256:1", token=True)
    assert "/etc/ironserve/hf_token:/run/ironserve/hf_token:ro" in docker and denv == {}
    assert "HF_TOKEN_PATH=/run/ironserve/hf_token" in docker and "--revision" not in docker


def test_missing_shard_error_names_host_path_and_shard():
    state = FakeState()
    host = create_host(
        state,
        facts={
            "model_weights.ModelCheckpoint": {
                "path=/mnt/m": {
                    "exists": True,
                    "config": True,
                    "index": True,
                    "shards": 2,
                    "missing": ["m-2.safetensors"],
                    "empty": [],
                    "manifest_stamp": None,
                    "verified_stamp": None,
                    "hub_stamp": None,
                    "hub_verified": None,
                }
            }
        },
    )
    host.name = "gpu-a"
    with ctx_state.use(state), ctx_host.use(host), pytest.raises(OperationError) as err:
        list(mw.checkpoint_verified._inner(path="/mnt/m"))
    assert str(err.value) == "gpu-a: the model weights at /mnt/m are not usable: shard m-2.safetensors is missing"


def test_manifest_check_real_sha256sum(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    subprocess.run(["sh", "-c", f"cd {tmp_path} && sha256sum config.json > {mw.MANIFEST}"], check=True)
    out = subprocess.run(["sh", "-c", mw.ModelCheckpoint().command(str(tmp_path))], capture_output=True, text=True)
    state = mw.ModelCheckpoint().process(out.stdout.splitlines())
    assert state["exists"] and state["config"] and state["manifest_stamp"] and not state["verified_stamp"]
    (tmp_path / "config.json").write_text("{ }")
    check = subprocess.run(["sh", "-c", f"cd {tmp_path} && sha256sum -c --quiet {mw.MANIFEST}"], capture_output=True)
    assert check.returncode != 0


# --------------------------------------------------------------------------- service units and the probe


def _tiny():
    recipe = _recipe("tiny-cpu")
    hosts = [
        InventoryHost("n0", {"ssh_hostname": "10.0.0.10"}),
        InventoryHost("n1", {"ssh_hostname": "10.0.0.11"}),
        InventoryHost("r0", {"ssh_hostname": "10.0.0.12", "ironserve_role": "router"}),
    ]
    return recipe, render(recipe, hosts)


def test_parse_check_invocations():
    recipe, rendered = _tiny()
    server, router = rendered.processes[0], rendered.processes[-1]
    argv = ss.parse_check_argv(recipe, server)
    assert argv[:5] == [f"{venv_path(recipe)}/bin/python3", ss.PARSE_CHECK, "--kind", "server", "--"]
    assert argv[5:] == server.argv[3:]
    assert ss.parse_check_argv(recipe, router)[3] == "router"
    glm = _recipe("glm5-nvfp4-mtp-rtx6000-tp8")
    proc = render(glm).processes[0]
    docker = ss.parse_check_argv(glm, proc)
    assert docker[:9] == [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{ss.PARSE_CHECK}:/ironserve-parse-check:ro",
        "--entrypoint",
        "python3",
    ]
    assert docker[9] == "ironserve/glm5-nvfp4-mtp-rtx6000-tp8:derived"
    assert docker[10:14] == ["/ironserve-parse-check", "--kind", "server", "--"]


def test_api_key_goes_through_the_launcher_not_argv():
    recipe, rendered = _tiny()
    proc = rendered.processes[0]
    files = unit_files(recipe, proc, recipe.tuning or _profile_tuning(), {"IRONSERVE_API_KEY": "s3cret"})
    assert "s3cret" not in files.unit_text and "IRONSERVE_API_KEY=s3cret" in files.env_text
    assert f"bin/python3 {KEY_LAUNCHER} -m sglang.launch_server" in files.unit_text
    glm = _recipe("glm5-nvfp4-mtp-rtx6000-tp8")
    argv = exec_argv(glm, render(glm).processes[0], api_key=True)
    assert f"{KEY_LAUNCHER}:{KEY_LAUNCHER}:ro" in argv
    assert container_command(glm, render(glm).processes[0], api_key=True)[:4] == [
        "python3",
        KEY_LAUNCHER,
        "-m",
        "sglang.launch_server",
    ]


def test_engines_and_router_get_the_api_key_but_not_the_hub_token(tmp_path):
    from roles.context import build_context

    key, token = tmp_path / "key", tmp_path / "token"
    key.write_text("s3cret\n")
    token.write_text("hf_x\n")
    data = {"hardware": "cpu-lab", "api_key_file": str(key), "hf_token_file": str(token)}
    hosts = [
        ("r0", {**data, "ssh_hostname": "10.0.0.12", "ironserve_role": "router"}),
        ("n0", {**data, "ssh_hostname": "10.0.0.10"}),
        ("n1", {**data, "ssh_hostname": "10.0.0.11"}),
    ]
    ctx = build_context("tiny", "r0", hosts)
    (router,) = ctx.processes
    secrets = ss.process_secrets(ctx, router)
    assert secrets == {"IRONSERVE_API_KEY": "s3cret"}
    files = unit_files(ctx.recipe, router, ctx.tuning, secrets)
    assert f"{KEY_LAUNCHER} -m sglang_router.launch_router" in files.unit_text and "s3cret" not in files.unit_text
    worker = build_context("tiny", "n0", hosts)
    # the hub token is the download step's alone: no engine has it in its environment (or `docker inspect`)
    assert set(ss.process_secrets(worker, worker.processes[0])) == {"IRONSERVE_API_KEY"}


def _profile_tuning():
    from ironserve.spec import HostTuning

    return HostTuning()


def test_ironserve_exec_hides_the_key_from_cmdline(tmp_path):
    (tmp_path / "fakeengine.py").write_text(
        textwrap.dedent("""\
        import json, os, sys
        cmdline = open("/proc/self/cmdline", "rb").read().split(b"\\0")
        out = {"cmdline": [c.decode() for c in cmdline if c], "argv": sys.argv[1:],
               "env": os.environ.get("IRONSERVE_API_KEY"), "name": __name__,
               "environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
               "fds": sorted(os.listdir("/proc/self/fd"))}
        open(os.environ["OUT"], "w").write(json.dumps(out))
        """)
    )
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "IRONSERVE_API_KEY": "s3cret-key", "OUT": str(out)}
    subprocess.run(
        [sys.executable, str(BIN / "ironserve-exec"), "-m", "fakeengine", "--port", "30000"], env=env, check=True
    )
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["--port", "30000", "--api-key", "s3cret-key"]
    assert not any("s3cret" in c for c in seen["cmdline"])
    assert seen["env"] is None and seen["name"] == "__main__"
    # not in the kernel's copy of the engine's environment either (/proc/PID/environ), nor an open pipe left over
    assert "s3cret" not in seen["environ"] and "IRONSERVE_API_KEY" not in seen["environ"]
    assert "OUT=" in seen["environ"] and len(seen["fds"]) <= 5, seen["fds"]
    # key from a root-only file on the host, and no key at all
    keyfile = tmp_path / "key"
    keyfile.write_text("filekey\n")
    env2 = {k: v for k, v in env.items() if k != "IRONSERVE_API_KEY"}
    subprocess.run(
        [sys.executable, str(BIN / "ironserve-exec"), "-m", "fakeengine"],
        check=True,
        env={**env2, "IRONSERVE_API_KEY_FILE": str(keyfile)},
    )
    assert json.loads(out.read_text())["argv"] == ["--api-key", "filekey"]
    assert "filekey" not in json.loads(out.read_text())["environ"]


@pytest.mark.parametrize(
    "env, names",
    [
        ({}, "neither IRONSERVE_API_KEY nor IRONSERVE_API_KEY_FILE is set"),
        ({"IRONSERVE_API_KEY": "  "}, "IRONSERVE_API_KEY is empty"),
        (
            {"IRONSERVE_API_KEY_FILE": "MISSING"},
            "the key file named by IRONSERVE_API_KEY_FILE (MISSING) cannot be read",
        ),
        ({"IRONSERVE_API_KEY_FILE": "EMPTY"}, "the key file named by IRONSERVE_API_KEY_FILE (EMPTY) is empty"),
    ],
)
def test_ironserve_exec_fails_closed_without_its_key(tmp_path, env, names):
    """A unit runs ironserve-exec only when it declares a key: a missing or empty key never starts the engine
    keyless. One line names the variable or file, no value; exit 78, which the keyed unit does not restart."""
    (tmp_path / "fakeengine.py").write_text("open(__import__('os').environ['OUT'], 'w').write('started')\n")
    (tmp_path / "EMPTY").write_text("\n")
    env = {k: str(tmp_path / v) if k.endswith("_FILE") else v for k, v in env.items()}
    names = names.replace("MISSING", str(tmp_path / "MISSING")).replace("EMPTY", str(tmp_path / "EMPTY"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("IRONSERVE_API_KEY")}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(BIN / "ironserve-exec"), "-m", "fakeengine", "--x"],
        text=True,
        env={**base, "PYTHONPATH": str(tmp_path), "OUT": str(out), **env},
        capture_output=True,
    )
    assert proc.returncode == 78 and not out.exists(), (proc.returncode, proc.stderr)
    assert names in proc.stderr and "not starting the engine without its API key" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_keyed_units_do_not_restart_a_launcher_that_found_no_key():
    from ironserve.catalogue import get_recipe
    from ironserve.render import render
    from ironserve.spec import HostTuning
    from ironserve.units import NO_KEY_EXIT

    recipe = get_recipe("tiny-cpu-tp2")
    proc = render(recipe).processes[0]
    keyed = unit_files(recipe, proc, HostTuning(), {"IRONSERVE_API_KEY": "k"}).unit_text.splitlines()
    keyless = unit_files(recipe, proc, HostTuning(), {}).unit_text
    assert f"RestartPreventExitStatus={NO_KEY_EXIT}" in keyed and "RestartPreventExitStatus" not in keyless
    assert "ironserve-exec" in " ".join(keyed) and "ironserve-exec" not in keyless


def test_ironserve_exec_keeps_the_key_out_of_the_engines_output(tmp_path):
    """The engine (and the processes it starts) print the key the way SGLang logs its server_args: what reaches
    ironserve-exec's stdout/stderr (the journal) has <hidden> in its place, everything else intact."""
    key = "sk-lab-" + "k" * 40
    (tmp_path / "chatty.py").write_text(
        textwrap.dedent("""\
        import logging, subprocess, sys
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        key = sys.argv[sys.argv.index("--api-key") + 1]
        logging.info("server_args=ServerArgs(model_path='/m', api_key=%r, port=30000)", key)
        print("stdout:", key, flush=True)
        sys.stdout.write("x" * 70000 + key + "y" * 10)  # one long line, the key across read chunks
        sys.stdout.write("\\r progress 1/2\\n")
        sys.stdout.flush()
        subprocess.run([sys.executable, "-c", "import sys; print('child', sys.argv[1])", key], check=True)
        """)
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "IRONSERVE_API_KEY": key}
    proc = subprocess.run(
        [sys.executable, str(BIN / "ironserve-exec"), "-m", "chatty"], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert key.encode() not in out
    assert b"api_key='<hidden>', port=30000" in out and b"stdout: <hidden>" in out and b"child <hidden>" in out
    assert b"x" * 70000 + b"<hidden>" + b"y" * 10 in out and b"progress 1/2" in out


def _fake_sglang(tmp_path):
    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(
        textwrap.dedent("""\
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--model-path", required=True)
                parser.add_argument("--tp-size", type=int)
                parser.add_argument("--tp-rank", type=int)
                parser.add_argument("--attention-backend", choices=["triton", "flashinfer"])
        """)
    )
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


@pytest.mark.parametrize(
    "args, rc, message",
    [
        (["--model-path", "/m", "--tp-size", "8"], 0, ""),
        (["--model-path", "/m", "--tp-sise", "8"], 2, "unrecognized arguments: --tp-sise 8"),
        (["--model-path", "/m", "--tp", "8"], 2, "unrecognized arguments: --tp 8"),  # no abbreviations
        (["--model-path", "/m", "--attention-backend", "fa9"], 2, "invalid choice: 'fa9'"),
    ],
)
def test_parse_check_uses_the_runtime_parser(tmp_path, args, rc, message):
    env = _fake_sglang(tmp_path)
    out = subprocess.run(
        [sys.executable, str(BIN / "ironserve-parse-check"), "--kind", "server", "--", *args],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == rc
    assert message in out.stderr


def test_parse_check_reads_the_parser_without_the_packages_frontend_and_falls_back_to_it(tmp_path):
    env = _fake_sglang(tmp_path)
    init = tmp_path / "sglang" / "__init__.py"
    init.write_text("raise SystemExit('the frontend ran')\n")  # sglang/__init__.py: the language frontend's import
    args = ["--kind", "server", "--", "--model-path", "/m"]
    check = [sys.executable, str(BIN / "ironserve-parse-check"), *args]
    assert subprocess.run(check, capture_output=True, text=True, env=env).returncode == 0
    # a release whose parser needs its package's own start (here: a value __init__.py sets) gets it
    init.write_text("STARTED = True\n")
    server_args = tmp_path / "sglang" / "srt" / "server_args.py"
    server_args.write_text("from sglang import STARTED\n" + server_args.read_text())
    out = subprocess.run([*check, "--tp-sise", "8"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "unrecognized arguments: --tp-sise 8" in out.stderr


def test_parse_check_without_sglang_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, "-I", str(BIN / "ironserve-parse-check"), "--kind", "router", "--"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 3 and "cannot import the router parser" in out.stderr


def _executing(facts):
    state = FakeState()
    state.is_executing = True
    return state, create_host(state, facts=facts)


def test_argv_parses_raises_with_the_parser_message_at_execution():
    probe = ["py", "probe", "--kind", "server", "--", "--tp", "8"]
    cmd = "py probe --kind server -- --tp 8"
    facts = {
        "sglang_service.MarkerDigest": {"path=/var/lib/ironserve/parse-ok/u": None},
        "sglang_service.ParseCheck": {f"probe={cmd}": {"rc": 2, "output": "error: unrecognized arguments: --tp 8"}},
    }
    state, host = _executing(facts)
    with ctx_state.use(state), ctx_host.use(host), pytest.raises(OperationError) as err:
        list(ss.argv_parses._inner(unit="u", probe=probe, digest="d"))
    assert "rejects the command line" in str(err.value) and "unrecognized arguments: --tp 8" in str(err.value)
    facts["sglang_service.ParseCheck"][f"probe={cmd}"] = {"rc": 0, "output": ""}
    state, host = _executing(facts)
    with ctx_state.use(state), ctx_host.use(host):
        assert [str(c) for c in ss.argv_parses._inner(unit="u", probe=probe, digest="d")] == [
            "mkdir -p /var/lib/ironserve/parse-ok && echo d > /var/lib/ironserve/parse-ok/u"
        ]


# --------------------------------------------------------------------------- launch


def test_health_url_on_the_host_itself():
    recipe, rendered = _tiny()
    assert rendered.processes[0].health_url == "http://127.0.0.1:30000/health"
    proc = rendered.processes[0]
    bound = dataclasses.replace(proc, bind="10.0.0.10", serves_http=True, port=30000)
    assert bound.health_url == "http://10.0.0.10:30000/health"
    router = next(p for p in rendered.processes if p.role == "router")
    # the router answers /health before any worker registered: its gate is /readiness
    assert router.health_url.endswith("/readiness")


def test_start_order_rank0_then_ranks_then_router():
    recipe = _recipe("llama3-8b-multinode-tp4")
    hosts = [
        InventoryHost(f"n{i}", {"ssh_hostname": f"10.0.0.{i}", "nic": "eth0"})
        for i in range(recipe.topology.node_count)
    ]
    waves = launch.start_order(render(recipe, hosts).processes)
    assert [p.node_rank for p in waves[0]] == [0] and all(p.node_rank > 0 for p in waves[1]) and waves[2] == []
    _, tiny = _tiny()
    waves = launch.start_order(tiny.processes)
    assert len(waves[0]) == 2 and [p.role for p in waves[2]] == ["router"]


def test_launch_gate_fails_when_a_host_failed():
    state = FakeState()
    state.failed_hosts = [SimpleNamespace(name="gpu-b")]
    host = create_host(state, facts={})
    with ctx_state.use(state), ctx_host.use(host), pytest.raises(OperationError) as err:
        list(launch.launch_gate._inner(hosts=["gpu-a", "gpu-b"]))
    assert "gpu-b" in str(err.value)
    state.failed_hosts = []
    with ctx_state.use(state), ctx_host.use(host):
        assert list(launch.launch_gate._inner(hosts=["gpu-a", "gpu-b"])) == []


class _Host:
    def __init__(self, answers):
        self.answers, self.logs, self.commands = list(answers), [], []
        self.data = {"health_progress_s": 0}

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        text = self.answers.pop(0) if command.startswith("curl") else "journal line 1\njournal line 2"
        return True, SimpleNamespace(stdout_lines=text.splitlines(), stdout=text)

    def log(self, message):
        self.logs.append(message)

    def log_styled(self, message, **kwargs):
        self.logs.append(message)


def test_wait_healthy_polls_until_200(monkeypatch):
    monkeypatch.setattr(health, "_sleep", lambda s: None)
    host = _Host(
        [
            "000\nActiveState=active\nSubState=running",
            "503\nActiveState=active\nSubState=running",
            "200\nActiveState=active\nSubState=running",
        ]
    )
    assert launch.wait_healthy(None, host, "u", "http://127.0.0.1:1/health", 60, poll_s=0.01) is True
    assert any("still waiting" in m for m in host.logs) and "healthy after" in host.logs[-1]


def test_wait_healthy_fails_with_journal_when_the_unit_dies(monkeypatch):
    monkeypatch.setattr(health, "_sleep", lambda s: None)
    host = _Host(["000\nActiveState=activating\nSubState=auto-restart"])
    assert launch.wait_healthy(None, host, "u", "http://127.0.0.1:1/health", 60, poll_s=0.01) is False
    assert "journal line 2" in host.logs[-1] and "auto-restart" in host.logs[-1]
    assert host.commands[-1].startswith("journalctl -u u.service -n 40")


def test_a_forming_group_may_restart_a_few_times_but_a_crash_loop_fails_its_gate(monkeypatch):
    monkeypatch.setattr(health, "_sleep", lambda s: None)

    def probe(code, sub, restarts):
        return f"{code}\nActiveState={'activating' if sub == 'auto-restart' else 'active'}\nSubState={sub}\nNRestarts={restarts}"

    # rank 0 of a group restarts once while a rank that left the previous group comes back: tolerated
    host = _Host([probe("000", "running", 4), probe("000", "auto-restart", 5), probe("200", "running", 5)])
    assert launch.wait_healthy(None, host, "u", "http://127.0.0.1:1/health", 60, poll_s=0.01, restarts_allowed=2)
    # a single-node unit: the first automatic restart is a death
    host = _Host([probe("000", "running", 4), probe("000", "auto-restart", 5)])
    assert not launch.wait_healthy(None, host, "u", "http://127.0.0.1:1/health", 60, poll_s=0.01)
    # a configuration that crashes at every start: the group's gate fails after its allowance
    host = _Host([probe("000", "auto-restart", n) for n in range(4, 9)])
    assert not launch.wait_healthy(None, host, "u", "http://127.0.0.1:1/health", 60, poll_s=0.01, restarts_allowed=2)
    assert "3 restart(s) during the gate" in host.logs[-1]


def test_changed_accepts_bools_and_metas():
    assert changed(True) and not changed(None)
    meta = SimpleNamespace(is_complete=lambda: True, did_change=lambda: True)
    assert changed(meta)


class _GroupHost:
    """A host whose shell answers a unit's InvocationID/ActiveState and a follower's record; records commands."""

    def __init__(self, name: str, invocation: str, following: dict | None = None):
        self.name, self.invocation, self.following, self.commands, self.data = name, invocation, following, [], {}

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        if command.startswith("systemctl show -p InvocationID"):
            return True, SimpleNamespace(stdout_lines=[f"InvocationID={self.invocation}", "ActiveState=active"])
        if command.startswith("cat /run/ironserve/rank-groups/"):
            return True, SimpleNamespace(stdout_lines=[json.dumps(self.following)] if self.following else [])
        return True, SimpleNamespace(stdout_lines=[])

    def log(self, message):
        self.commands.append(f"log: {message}")


@pytest.mark.parametrize(
    "following, restarted",
    [
        ({"leader_invocation": "g2", "engine_invocation": "r1-new"}, False),  # its guard followed rank 0's new start
        ({"leader_invocation": "g1", "engine_invocation": "r1-new"}, True),  # still on rank 0's previous generation
        ({"leader_invocation": "g2", "engine_invocation": "r1-old"}, True),  # a record of an engine that is gone
        (None, True),  # no guard record at all
    ],
)
def test_a_rank_follows_rank0s_invocation_not_the_clocks_of_two_hosts(monkeypatch, following, restarted):
    monkeypatch.setattr(health, "_sleep", lambda s: None)
    head, me = _GroupHost("n0", "g2"), _GroupHost("n1", "r1-new", following)
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name: head))
    assert launch.restart_unless_following(state, me, "u", ["n0", "u"], follow_s=0) is True
    assert (deliberate("restart", "u") in me.commands) is restarted
    # no timestamps asked of either host: identity only
    assert not any("Timestamp" in c for c in head.commands + me.commands)


class _ScriptedHost:
    """A host whose shell answers by the first matching prefix of a script; records every command and log."""

    def __init__(self, name: str, answers: dict[str, list[str]]):
        self.name, self.answers, self.commands, self.logs, self.data = name, answers, [], [], {}

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        for key, lines in self.answers.items():
            if key in command:
                return True, SimpleNamespace(stdout_lines=lines, stdout="\n".join(lines))
        return True, SimpleNamespace(stdout_lines=[], stdout="")

    def log_styled(self, message, **kwargs):
        self.logs.append(message)

    log = log_styled


def test_rollback_restores_every_member_of_the_group_rank0_first():
    from roles import rollback

    snapshot = [
        "current aaa  /etc/systemd/system/u.service",
        "snapshot bbb  /etc/systemd/system/u.service",
        "taken 2026-11-22T08:41:46Z",
    ]
    n0, n1 = _ScriptedHost("n0", {"sha256sum": snapshot}), _ScriptedHost("n1", {"sha256sum": snapshot})
    hosts = {"n0": n0, "n1": n1}
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.get), activated_hosts={n0, n1})
    members = [("n0", "u", ["/etc/systemd/system/u.service"]), ("n1", "u", ["/etc/systemd/system/u.service"])]
    waited = []
    rollback.roll_back(
        state,
        n0,
        "u",
        "http://127.0.0.1:30000/health",
        60,
        members,
        "the unit died",
        lambda *a: waited.append(a) or True,
    )
    for h in (n0, n1):
        assert any(c.endswith("MANIFEST; trap - EXIT; systemctl daemon-reload") for c in h.commands), h.commands
        assert deliberate("restart", "u") in h.commands
    assert waited and any(
        line.startswith("ROLLED BACK u on n0, n1") and "from 2026-11-22T08:41:46Z" in line for line in n0.logs
    ), n0.logs


def _rollback_failing_on_n1(fails, error: str):
    """A rollback of a group on n0 and n1 where n1 fails the commands ``fails(command)`` picks, saying ``error``:
    (n0, n1, the gate waits that followed)."""
    from roles import rollback

    snapshot = ["current aaa  /p", "snapshot bbb  /p", "taken 2026-11-22T08:41:46Z"]
    n0, n1 = _ScriptedHost("n0", {"sha256sum": snapshot}), _ScriptedHost("n1", {"sha256sum": snapshot})

    def answer(command, **kwargs):
        n1.commands.append(command)
        if fails(command):
            return False, SimpleNamespace(stdout_lines=[], stderr_lines=[error])
        return True, SimpleNamespace(stdout_lines=snapshot, stdout="\n".join(snapshot))

    n1.run_shell_command = answer
    state = SimpleNamespace(inventory=SimpleNamespace(get_host={"n0": n0, "n1": n1}.get), activated_hosts={n0, n1})
    waited = []
    rollback.roll_back(
        state,
        n0,
        "u",
        "url",
        60,
        [("n0", "u", ["/p"]), ("n1", "u", ["/p"])],
        "why",
        lambda *a: waited.append(a) or True,
    )
    return n0, n1, waited


def test_a_failed_restore_stops_the_rollback_before_any_restart():
    # n1's disk refuses the restore
    n0, n1, waited = _rollback_failing_on_n1(
        lambda c: "MANIFEST" in c and "sha256sum" not in c, "cp: No space left on device"
    )
    assert not waited and not any("restart" in c for c in n0.commands + n1.commands)
    assert "ROLLBACK FAILED u" in n0.logs[-1] and "restore" in n0.logs[-1] and "No space left" in n0.logs[-1]


def test_a_restore_keeps_the_current_secrets(tmp_path):
    from roles import rollback

    snap, live = tmp_path / "snap", tmp_path / "live"
    snap.mkdir(), live.mkdir()
    (live / "u.env").write_text("# m\nSGLANG_X=new\nIRONSERVE_API_KEY=rotated\n")
    (live / "u.service").write_text("new unit\n")
    (snap / "u.env").write_text("# m\nSGLANG_X=old\nIRONSERVE_API_KEY=revoked\nHF_TOKEN=revoked\n")
    (snap / "u.env").chmod(0o600)
    (snap / "u.service").write_text("old unit\n")
    (snap / "MANIFEST").write_text(f"x  {live / 'u.env'}\nx  {live / 'u.service'}\n")
    command = rollback.restore_command("u").replace(rollback.snapshot_dir("u"), str(snap))
    command = command.replace("systemctl daemon-reload", "true")
    assert subprocess.run(["bash", "-c", command]).returncode == 0
    assert (live / "u.env").read_text() == "# m\nSGLANG_X=old\nIRONSERVE_API_KEY=rotated\n"
    assert (live / "u.env").stat().st_mode & 0o777 == 0o600
    assert (live / "u.service").read_text() == "old unit\n"


def _snapshot(tmp_path, snap_env: str, live_env: str):
    """A last good snapshot (unit + env) and the live files, in tmp_path; the restore command aimed at them."""
    from roles import rollback

    snap, live = tmp_path / "snap", tmp_path / "live"
    snap.mkdir(), live.mkdir()
    (live / "u.env").write_text(live_env)
    (live / "u.service").write_text("new unit\n")
    (snap / "u.env").write_text(snap_env)
    (snap / "u.service").write_text("old unit\n")
    (snap / "MANIFEST").write_text(f"x  {live / 'u.service'}\nx  {live / 'u.env'}\n")
    command = rollback.restore_command("u").replace(rollback.snapshot_dir("u"), str(snap))
    return live, command.replace("systemctl daemon-reload", "true")


@pytest.mark.parametrize(
    "snap_env, live_env",
    [
        ("# m\nSGLANG_X=old\n", "# m\nSGLANG_X=new\nIRONSERVE_API_KEY=k-live\n"),  # a keyless unit under a key
        ("# m\nIRONSERVE_API_KEY=k-old\n", "# m\nSGLANG_X=new\n"),  # a keyed unit, the key since removed
        ("# m\nIRONSERVE_API_KEY=k-old\n", "# m\nIRONSERVE_API_KEY_FILE=/etc/k\n"),  # another kind of key
    ],
)
def test_a_rollback_never_crosses_a_key_change(tmp_path, snap_env, live_env):
    live, command = _snapshot(tmp_path, snap_env, live_env)
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert proc.returncode == 3 and "no rollback of u" in proc.stderr and "key/no-key change" in proc.stderr
    assert "k-old" not in proc.stderr and "k-live" not in proc.stderr and "/etc/k" not in proc.stderr.split("(")[0]
    assert (live / "u.env").read_text() == live_env and (live / "u.service").read_text() == "new unit\n"


def test_a_restore_that_cannot_write_fails_and_leaves_the_live_files(tmp_path):
    """grep failing mid-write (a full disk: status 2) fails the restore; nothing live changed, no copy left."""
    live, command = _snapshot(
        tmp_path, "# m\nSGLANG_X=old\nIRONSERVE_API_KEY=x\n", "# m\nSGLANG_X=new\nIRONSERVE_API_KEY=k\n"
    )
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "grep").write_text(
        '#!/bin/sh\ncase "$1" in -Ev) echo "# m"; echo "grep: write error: No space left on '
        'device" >&2; exit 2;; esac\nexec /bin/grep "$@"\n'
    )
    (stub / "grep").chmod(0o755)
    proc = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"},
    )
    assert proc.returncode != 0 and "No space left" in proc.stderr
    assert (live / "u.env").read_text() == "# m\nSGLANG_X=new\nIRONSERVE_API_KEY=k\n"
    assert (live / "u.service").read_text() == "new unit\n"  # staged first, renamed only when all were written
    assert sorted(p.name for p in live.iterdir()) == ["u.env", "u.service"]
    # the same restore on a disk with room: done
    assert subprocess.run(["sh", "-c", command]).returncode == 0
    assert (live / "u.env").read_text() == "# m\nSGLANG_X=old\nIRONSERVE_API_KEY=k\n"


def test_a_key_change_on_one_member_stops_the_rollback_of_the_whole_group():
    # n1's last good configuration is keyless: its key check refuses, before n0 restored anything
    n0, n1, waited = _rollback_failing_on_n1(lambda c: "no rollback of" in c, "no rollback of u: ... key/no-key change")
    assert not waited and not any("daemon-reload" in c or "reset-failed" in c for c in n0.commands + n1.commands)
    assert "ROLLBACK FAILED u" in n0.logs[-1] and "key/no-key change" in n0.logs[-1]


def test_no_rollback_without_a_differing_snapshot_or_with_a_member_outside_the_run():
    from roles import rollback

    same = ["current aaa  /p", "snapshot aaa  /p"]
    n0, n1 = _ScriptedHost("n0", {"sha256sum": same}), _ScriptedHost("n1", {"sha256sum": same})
    state = SimpleNamespace(inventory=SimpleNamespace(get_host={"n0": n0, "n1": n1}.get), activated_hosts={n0, n1})
    members = [("n0", "u", ["/p"]), ("n1", "u", ["/p"])]
    rollback.roll_back(state, n0, "u", "url", 60, members, "why", lambda *a: True)
    assert not any("restart" in c for c in n0.commands) and "no last good configuration" in n0.logs[-1]
    state.activated_hosts = {n0}  # n1 left out (--limit)
    rollback.roll_back(state, n0, "u", "url", 60, members, "why", lambda *a: True)
    assert "n1 of its group not in this run" in n0.logs[-1]
