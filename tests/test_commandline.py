"""Pasted commands: one parser (ironserve.commandline) for import, lint and the real-parser check's launcher
detection, so wrappers, docker run, env and launchers mean the same thing to all three."""

from __future__ import annotations

import shlex

import pytest
import yaml

from ironserve import catalogue
from ironserve.cli import main
from ironserve.commandline import CommandError, parse_command, parse_script
from ironserve.engine_parser import split_launcher
from ironserve.findings import Severity
from ironserve.importer import import_command, import_commands
from ironserve.lint import lint_pasted

HW = catalogue.hardware_profiles()
LAUNCH = "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp-size 2 --port 30000"

WRAPPED = [
    f"nohup {LAUNCH} > server.log 2>&1 &",
    f"exec {LAUNCH}",
    f"env -u http_proxy NCCL_DEBUG=INFO {LAUNCH}",
    f"numactl --cpunodebind=0 --membind 0 {LAUNCH}",
    f"numactl -N 1 -m 1 {LAUNCH}",
    f"taskset -c 0-31 {LAUNCH}",
    f"uv run --python 3.12 --with sglang {LAUNCH}",
    f"sudo -E nohup taskset 0xff {LAUNCH} | tee log.txt",
    "CUDA_VISIBLE_DEVICES=0,1 nohup python3 -u -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp-size 2 "
    "--port 30000 &",
]


@pytest.mark.parametrize("line", WRAPPED)
def test_wrappers_mean_the_same_to_import_lint_and_the_parser_check(line):
    words = shlex.split(line)
    command = parse_command(words)
    assert command.kind == "server" and command.launcher == "launch_server"
    assert command.flags == ["--model-path", "Qwen/Qwen3-8B", "--tp-size", "2", "--port", "30000"]
    # the real-parser check's launcher detection (no venv needed for this part)
    kind, launcher, flags = split_launcher(words)
    assert (kind, launcher, flags) == ("server", "launch_server", command.flags)
    # lint: no launcher finding; import: the same flags
    assert not [f for f in lint_pasted(words, HW["rtx6000-pro"]) if f.rule == "not-an-sglang-launch"]
    data = import_command(words, "rtx6000-pro", "w", engine="0.5.23")
    assert data["server"]["tp_size"] == 2 and data["server"]["port"] == 30000


def test_docker_run_line_is_parsed_by_meaning():
    line = (
        "sudo docker run -d --gpus all --shm-size 32g --ipc host --network=host --ulimit memlock=-1 "
        "--ulimit stack=67108864 -v /models:/models:ro --device /dev/infiniband -e NCCL_IB_HCA=mlx5 "
        "--env-file /etc/sglang.env -p 30000:30000 --runtime=nvidia --name sgl "
        "lmsysorg/sglang:v0.5.9-cu129@sha256:" + "a" * 64 + " python3 -m sglang.launch_server --model-path "
        "/models/x --tp-size 8"
    )
    command = parse_command(shlex.split(line))
    d = command.docker
    assert d.image == "lmsysorg/sglang:v0.5.9-cu129" and d.digest == "sha256:" + "a" * 64
    assert (d.detach, d.gpus, d.shm_size, d.ipc, d.network) == (True, "all", "32g", "host", "host")
    assert d.ulimits == {"memlock": "-1", "stack": "67108864"} and d.volumes == ["/models:/models:ro"]
    assert d.devices == ["/dev/infiniband"] and d.env == {"NCCL_IB_HCA": "mlx5"}
    assert d.env_files == ["/etc/sglang.env"] and d.other == ["-p", "30000:30000", "--runtime=nvidia"]
    assert command.wrappers == ["sudo"] and command.flags[-2:] == ["--tp-size", "8"]


def test_docker_entrypoint_and_bash_c():
    command = parse_command(
        shlex.split("docker run --gpus all --entrypoint python3 img:1 -m sglang.launch_server --model-path m")
    )
    assert command.docker.entrypoint == "python3" and command.module == "sglang.launch_server"
    command = parse_command(
        shlex.split(
            "docker run -it img:1 bash -c 'FOO=1 python3 -m sglang.launch_server --model-path m --port 1 > /log 2>&1'"
        )
    )
    assert command.env == {"FOO": "1"} and command.flags == ["--model-path", "m", "--port", "1"]


def test_docker_run_imports_to_a_docker_runtime_that_renders_back():
    from ironserve.render import render
    from ironserve.spec import Recipe
    from ironserve.units import exec_argv

    line = (
        "docker run --gpus all --shm-size 32g --ipc=host --network=host --ulimit memlock=-1 "
        "-v /models:/models --entrypoint python3 lmsysorg/sglang:v0.5.9-cu129 -m sglang.launch_server "
        "--model-path /models/Qwen3-8B --tp-size 2"
    )
    data = import_command(shlex.split(line), "rtx6000-pro", "d")
    recipe = Recipe.model_validate(data)
    assert recipe.engine.sglang == "0.5.9" and recipe.runtime.kind == "docker"
    (proc,) = render(recipe).processes
    again = parse_command(exec_argv(recipe, proc))
    assert again.docker.entrypoint == "python3" and again.docker.shm_size == "32g"
    # the pasted flags, then SGLang's metrics: ironserve's default (server.enable_metrics)
    assert again.flags == ["--model-path", "/models/Qwen3-8B", "--tp-size", "2", "--enable-metrics"]


def test_router_launchers():
    pd = parse_command(
        shlex.split(
            "python -m sglang_router.launch_router --pd-disaggregation --prefill "
            "http://10.0.0.1:30000 9000 --decode http://10.0.0.2:30001"
        )
    )
    assert (pd.kind, pd.launcher) == ("router", "launch_router")
    dp = parse_command(
        shlex.split("python -m sglang_router.launch_server --model-path m --dp 4 --tp 2 --router-policy round_robin")
    )
    assert (dp.kind, dp.launcher) == ("router-server", "router_launch_server")
    assert split_launcher(dp.argv) == (
        "server",
        "router_launch_server",
        ["--model-path", "m", "--dp", "4", "--tp", "2"],
    )


def test_not_an_sglang_launch_is_an_error_offline(capsys):
    words = shlex.split("python -m sglang.server --model_dir /models/llama --port 8000")
    with pytest.raises(CommandError) as err:
        parse_command(words)
    assert "no SGLang release" in str(err.value) and "sglang.launch_server" in err.value.fix
    findings = lint_pasted(words, HW["rtx6000-pro"])
    assert [f.severity for f in findings if f.rule == "not-an-sglang-launch"] == [Severity.error]
    assert main(["lint", "--hardware", "rtx6000-pro", "--offline", "--", *words]) == 1
    assert "not-an-sglang-launch" in capsys.readouterr().out
    with pytest.raises(ValueError):
        split_launcher(words)  # the real-parser check says engine-unknown-launcher for it


def test_underscore_flags_are_an_error():
    words = shlex.split("python3 -m sglang.launch_server --model_path /m --tp-size 1")
    assert "not-an-sglang-launch" in {
        f.rule for f in lint_pasted(words, HW["rtx6000-pro"]) if f.severity is Severity.error
    }
    with pytest.raises(CommandError) as err:
        import_command(words, "rtx6000-pro", "u")
    assert "--model-path" in err.value.fix


def test_script_variables_exports_and_several_commands():
    script = parse_script(
        "MODEL=Qwen/Qwen3-8B\nexport NCCL_DEBUG=INFO\necho starting\n"
        "python3 -m sglang.launch_server --model-path $MODEL \\\n  --port ${PORT:-30000}\n"
    )
    ((command, _),) = script.commands
    assert command.flags == ["--model-path", "Qwen/Qwen3-8B", "--port", "30000"]
    assert command.env == {"NCCL_DEBUG": "INFO"} and script.skipped == ["echo starting"]


def test_secrets_are_replaced_by_references_and_said():
    words = shlex.split(
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123456 python3 -m sglang.launch_server --model-path "
        "Qwen/Qwen3-8B --api-key sk-0123456789abcdef0123 --host 0.0.0.0"
    )
    result = import_commands([parse_command(words)], "rtx6000-pro", "s", engine="0.5.23")
    text = yaml.safe_dump(result.data)
    assert "hf_abcdef" not in text and "sk-0123" not in text
    assert result.data["server"]["api_key_file"] == "/etc/ironserve/s.api_key"
    secrets = [f for f in result.findings if f.rule == "import-secret"]
    assert len(secrets) == 2 and any("hf_token_file" in f.fix for f in secrets)


def test_import_cli_prints_findings_and_reads_scripts(tmp_path, capsys):
    script = tmp_path / "launch.sh"
    script.write_text(
        "nohup python3 -m sglang.launch_server --model-path meta-llama/Llama-4-Scout-17B-16E-Instruct "
        "--tp 8 --trust-remote --host ${local_ip} > log 2>&1 &\n"
    )
    assert main(["import", "--hardware", "rtx6000-pro", "--id", "scout", "--offline", "--file", str(script)]) == 0
    out = capsys.readouterr()
    data = yaml.safe_load(out.out)
    assert data["model"]["family"] == "llama4"
    assert data["server"]["trust_remote_code"] is True  # --trust-remote expanded
    assert data["server"]["host"] == "{node_address}"
    assert "import-engine" in out.err and "sglang 0.5.9" in out.err


def test_import_errors_name_the_flag_what_was_expected_and_the_fix(capsys):
    rc = main(
        [
            "import",
            "--hardware",
            "rtx6000-pro",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--port",
            "http",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--port http: expected a whole number between 1 and 65535" in err and "Fix: write --port" in err
    rc = main(
        [
            "import",
            "--hardware",
            "rtx6000-pro",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--mem-fraction-static",
            "85",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--mem-fraction-static 85: expected a fraction between 0 and 1" in err
    assert "Traceback" not in err


def test_lint_reads_scripts_and_docker_lines(tmp_path, capsys):
    script = tmp_path / "pd.sh"
    script.write_text(
        "export SGLANG_ENABLE_SPEC_V2=1\n"
        "nohup python -m sglang.launch_server --model-path /m --device npu --tp-size 16 \\\n"
        "  --disaggregation-mode prefill --disaggregation-transfer-backend mooncake > p.log 2>&1 &\n"
        "python -m sglang_router.launch_router --pd-disaggregation --prefill http://10.0.0.1:8000 8998 "
        "--decode http://10.0.0.2:8001\n"
    )
    assert main(["lint", "--hardware", "atlas-800i-a3", "--offline", "--file", str(script)]) == 1
    out = capsys.readouterr().out
    assert "pd-ascend-transfer-backend" in out and "command 1" in out
    words = shlex.split(
        "docker run --gpus all lmsysorg/sglang:latest python3 -m sglang.launch_server --model-path /m --host 127.0.0.1"
    )
    assert "unpinned-image" in {f.rule for f in lint_pasted(words, HW["rtx6000-pro"])}


def test_env_unset_and_unknown_docker_options():
    words = shlex.split("env -u http_proxy --unset=https_proxy python3 -m sglang.launch_server --model-path m")
    assert parse_command(words).env_unset == ["http_proxy", "https_proxy"]
    assert import_command(words, "cpu-lab", "e", engine="0.5.23")["env_unset"] == ["http_proxy", "https_proxy"]
    kept = parse_command(
        shlex.split("docker run --gpus all --blkio-weight=300 img:1 python3 -m sglang.launch_server --model-path m")
    )
    assert kept.docker.other == ["--blkio-weight=300"]
    with pytest.raises(CommandError) as err:
        parse_command(shlex.split("docker run --blkio-weight 300 img:1 python3 -m sglang.launch_server"))
    assert "--blkio-weight" in str(err.value) and "--option=value" in err.value.fix


def test_import_writes_an_inventory_that_renders_the_same_router_urls(tmp_path, capsys):
    from ironserve.fleet import load_inventory
    from ironserve.render import render

    script = tmp_path / "pd.sh"
    script.write_text(
        "python -m sglang.launch_server --model-path m --disaggregation-mode prefill --port 30000 "
        "--disaggregation-bootstrap-port 9001\n"
        "python -m sglang.launch_server --model-path m --disaggregation-mode decode --port 30001\n"
        "python -m sglang_router.launch_router --pd-disaggregation --prefill http://10.1.0.5:30000 9001 "
        "--decode http://10.1.0.6:30001 --port 8000\n"
    )
    recipe_file, inventory = tmp_path / "pd.yaml", tmp_path / "pd_inventory.py"
    assert (
        main(
            [
                "import",
                "--hardware",
                "gb200",
                "--id",
                "pd",
                "--offline",
                "--file",
                str(script),
                "-o",
                str(recipe_file),
                "--inventory-out",
                str(inventory),
            ]
        )
        == 0
    )
    capsys.readouterr()
    rendered = render(catalogue.get_recipe(str(recipe_file)), load_inventory(inventory))
    (router,) = [p for p in rendered.processes if p.role == "router"]
    assert router.argv[router.argv.index("--prefill") + 1 : router.argv.index("--prefill") + 3] == [
        "http://10.1.0.5:30000",
        "9001",
    ]
    assert router.argv[router.argv.index("--decode") + 1] == "http://10.1.0.6:30001"


def test_router_and_prefill_disagreeing_on_the_bootstrap_port_is_said():
    from ironserve.importer import import_script

    result = import_script(
        "python -m sglang.launch_server --model-path m --disaggregation-mode prefill --port 1\n"
        "python -m sglang.launch_server --model-path m --disaggregation-mode decode --port 2\n"
        "python -m sglang_router.launch_router --pd-disaggregation --prefill http://a:1 9001 "
        "--decode http://b:2\n",
        "gb200",
        "pd",
        hardware_arch="sm100",
    )
    (hit,) = [f for f in result.findings if f.rule == "import-bootstrap-mismatch"]
    assert "9001" in hit.message and "8998" in hit.message


def test_ascend_import_runs_the_npu_image_not_a_cuda_stack():
    from ironserve.render import render
    from ironserve.spec import Recipe
    from ironserve.units import exec_argv

    words = shlex.split(
        "python3 -m sglang.launch_server --model-path /models/Qwen3-8B --device npu "
        "--attention-backend ascend --tp-size 16"
    )
    result = import_commands([parse_command(words)], "atlas-800i-a3", "npu")
    runtime = result.data["runtime"]
    assert runtime["kind"] == "docker" and runtime["image"] == "lmsysorg/sglang:main-cann8.3.rc1-a3"
    assert "/dev/davinci15" in runtime["run"]["devices"] and runtime["run"]["privileged"] is True
    assert runtime["run"]["gpus"] is None and "packages" not in runtime
    assert result.data["engine"]["parser_version"] == "0.5.10.post1"  # the seeds' Ascend era, said in a finding
    recipe = Recipe.model_validate(result.data)
    argv = exec_argv(recipe, render(recipe).processes[0])
    assert "--gpus" not in argv and "--device" in argv and "/usr/local/Ascend/driver:/usr/local/Ascend/driver" in argv


def test_an_image_given_as_a_shell_variable_is_refused_with_a_fix():
    with pytest.raises(CommandError) as err:
        import_command(
            shlex.split("docker run --gpus all $IMAGE python3 -m sglang.launch_server --model-path m"),
            "rtx6000-pro",
            "i",
        )
    assert "$IMAGE" in str(err.value) and "repository:tag" in err.value.fix


def test_replicas_on_different_ports_are_said():
    from ironserve.importer import import_script

    result = import_script(
        "python -m sglang_router.launch_router --worker-urls http://worker1:8000 "
        "http://worker2:8001 --policy cache_aware --host 0.0.0.0 --port 30000\n",
        "rtx6000-pro",
        "r",
    )
    assert result.data["topology"]["kind"] == "replicas"
    (hit,) = [f for f in result.findings if f.rule == "import-worker-ports"]
    assert "8000, 8001" in hit.message
