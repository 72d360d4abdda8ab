"""`ironserve import -o FILE` writes a recipe that loads: its id is the file's name, and it is checked before it is
written (a tp_size larger than the hardware's devices stops it with exit 2, nothing written)."""

from __future__ import annotations

from ironserve import catalogue
from ironserve.cli import main

LAUNCH = ["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"]


def test_the_file_names_the_recipe_and_it_loads(tmp_path, capsys):
    out = tmp_path / "llama-site.yaml"
    assert main(["import", "--hardware", "h100-sxm", "--offline", "-o", str(out), "--", *LAUNCH, "--tp-size", "8"]) == 0
    assert catalogue.get_recipe(str(out)).id == "llama-site"
    assert main(["render", str(out), "--format", "shell"]) == 0
    assert "--tp-size 8" in capsys.readouterr().out


def test_an_id_that_differs_from_the_file_is_refused(tmp_path, capsys):
    out = tmp_path / "llama-site.yaml"
    assert main(["import", "--hardware", "h100-sxm", "--offline", "--id", "other", "-o", str(out), "--", *LAUNCH]) == 2
    assert "differs from the file name" in capsys.readouterr().err and not out.exists()


def test_more_devices_than_the_hardware_has_is_an_error_before_writing(tmp_path, capsys):
    out = tmp_path / "too-wide.yaml"
    assert (
        main(["import", "--hardware", "h100-sxm", "--offline", "-o", str(out), "--", *LAUNCH, "--tp-size", "16"]) == 2
    )
    err = capsys.readouterr().err
    assert "needs 16 devices per node; h100-sxm has 8" in err and "lower tp_size to at most 8" in err
    assert not out.exists()
