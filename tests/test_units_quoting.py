"""ironserve/units.py's quoting at its sinks, each checked by what the sink's reader makes of it: ExecStart words
(systemd's quoting: % and $ doubled), env files (one KEY=VALUE line each, read back alike), the runtime's env
scripts sourced by bash, the shell commands of deliberate starts, and unit template values on one line."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from ironserve import units


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("plain", "plain"),
        ("-_./:=,+@09AZaz", "-_./:=,+@09AZaz"),  # every character that needs no quotes
        ("", '""'),
        ("two words", '"two words"'),
        ("a;b", '"a;b"'),
        ("it's", '"it\'s"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("50%", '"50%%"'),  # a specifier to systemd
        ("%n", '"%%n"'),
        ("$HOME", '"$$HOME"'),  # a variable to systemd
        ("${X}%i", '"$${X}%%i"'),
        ("tab\there", '"tab\there"'),
        ("é", "é"),  # str.isalnum: a letter
    ],
)
def test_an_execstart_word_is_quoted_as_systemd_reads_it(word, quoted):
    assert units.systemd_quote(word) == quoted


def test_env_lines_refuse_what_the_two_readers_would_read_apart_naming_the_key_only():
    assert units._env_line("NCCL_DEBUG", "INFO=x y") == "NCCL_DEBUG=INFO=x y"
    for key, value, why in [
        ("1BAD", "s3cr3t", "not a variable name"),
        ("A-B", "s3cr3t", "not a variable name"),
        ("K", " s3cr3t", "leading or trailing spaces"),
        ("K", "s3\\cr3t", "a backslash"),
        ("K", "'s3cr3t'", "a leading quote"),
        ("K", "s3\ncr3t", "control character U+000A"),
    ]:
        with pytest.raises(ValueError) as err:
            units._env_line(key, value)
        assert str(err.value).startswith(f"env {key}: {why}") and "cr3t" not in str(err.value)


def test_an_env_file_reads_back_as_written_comments_and_blank_lines_skipped():
    proc = SimpleNamespace(env={"A": "1", "URL": "http://h/?x=1&y=2", "EMPTY": ""})
    text = units.env_text(proc, {"HF_TOKEN": "hf_secret"})
    assert text.startswith("# managed by ironserve") and text.endswith("=hf_secret\n")
    assert text.count("\n") == 5
    assert units.read_env_text(text) == {"A": "1", "URL": "http://h/?x=1&y=2", "EMPTY": "", "HF_TOKEN": "hf_secret"}
    assert units.env_text(proc) == text.replace("HF_TOKEN=hf_secret\n", "")
    assert units.read_env_text("\n; note=1\n#C=2\nnoequals\nK==v=\n") == {"K": "=v="}


def test_the_runtime_env_scripts_are_sourced_in_order_whatever_their_names_then_the_argv_runs(tmp_path):
    first, second = tmp_path / "set env.sh", tmp_path / "it's;$(touch pwned).sh"
    first.write_text("export A=one\n")
    second.write_text('export B="$A-two"\n')
    script = units.sourcing_script([str(first), str(second)])
    out = subprocess.run(
        ["/bin/bash", "-c", script, "unit", "sh", "-c", 'echo "$B $1"', "sh", "arg with space"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout
    assert out == "one-two arg with space\n" and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("verb", ["start", "restart"])
def test_a_deliberate_start_resets_the_restart_count_first_whatever_the_unit_is_named(tmp_path, verb):
    log = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\nprintf "%s|" "$@" >> {log}\necho >> {log}\n[ "$1" != reset-failed ]\n')
    fake.chmod(0o755)
    unit = "sglang-a b;touch pwned"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", units.deliberate(verb, unit)], env=env, cwd=tmp_path, capture_output=True)
    assert done.returncode == 0 and done.stderr == b""  # reset-failed's complaint about a healthy unit is hidden
    assert log.read_text() == f"reset-failed|{unit}.service|\n{verb}|{unit}.service|\n"
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(AssertionError):
        units.deliberate("stop", "u")


def test_a_unit_template_value_with_a_control_character_is_refused_before_it_adds_a_line():
    template = units._jinja().from_string("Description={{ value }}\n")
    assert template.render(value="a b %") == "Description=a b %\n"
    for bad in ("x\nExecStartPre=/bin/sh", "x\rY", "x\x00"):
        with pytest.raises(ValueError, match="a unit file value has a control character"):
            template.render(value=bad)


def test_limits_unlimited_is_systemds_infinity():
    assert [units._limit(v) for v in ("unlimited", -1, None, 0, 65536, "1024")] == [
        "infinity",
        "infinity",
        "infinity",
        "0",
        "65536",
        "1024",
    ]
