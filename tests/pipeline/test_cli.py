"""The `chorus` command as a user meets it: every subcommand's --help exits 0, starts nothing and
shows the values that invocation would use; every mistake is one line, exit status 2, and
leaves nothing behind; the exit statuses of the contract (pipeline/cli/exits.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.cli import main
from pipeline.cli.commands import COMMANDS
from pipeline.cli.parse import schema_keys
from tests.helpers import REPO


def test_help_of_every_command_exits_0_starts_nothing_and_lists_its_keys(tmp_path):
    # in a process of its own: --help must not import Ray or the work's modules, nor write a file
    probe = (
        "import contextlib, io, json, sys; from pipeline.cli import main; from pipeline.cli.commands import COMMANDS\n"
        "out = {}\n"
        "for c in COMMANDS:\n"
        "    buffer = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buffer):\n"
        "        out[c.name] = (main([c.name, '--help']), buffer.getvalue())\n"
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'help started work'\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    helped = json.loads(done.stdout)
    for command in COMMANDS:
        status, text = helped[command.name]
        assert status == 0 and text.startswith(command.usage), command.name
        shown = [key for key in schema_keys(command.schema) if f"\n  {key} = " in text]
        assert {key.split(".")[0] for key in shown} == set(command.groups), command.name
    assert list(tmp_path.iterdir()) == []


def test_help_shows_the_values_after_the_chosen_groups(capsys):
    assert main(["run", "--help"]) == 0
    cpu = capsys.readouterr().out
    assert main(["run", "--help", "engine=gpu", "engine.max_rows=7", "output.dir=/somewhere"]) == 0
    gpu = capsys.readouterr().out
    # conf/engine/cpu.yaml's and gpu.yaml's budgets, not the schema's default
    assert "\n  engine.max_rows = 8 " in cpu and "engine=cpu" in cpu
    assert "\n  engine.max_rows = 7 " in gpu and "engine=gpu" in gpu
    assert "\n  output.dir = /somewhere " in gpu
    assert f"\n  data.path = {REPO / 'data' / 'demo' / 'demo.parquet'} " in cpu  # resolved
    assert main(["run", "--help", "data=parquet"]) == 0
    assert "\n  data.path = ??? " in capsys.readouterr().out


def test_the_overview_names_every_command_and_the_exit_statuses(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {command.name} " in out for command in COMMANDS)
    assert "130" in out and "rejected" in out


@pytest.mark.parametrize(
    "args, said",
    [
        (["run", "engine.slots=0"], "unknown key 'engine.slots' (did you mean engine.max_rows?)"),
        (["run", "+engine.slots=0"], "unknown key 'engine.slots' (did you mean engine.max_rows?)"),
        (["run", "max_frames=3"], "(did you mean model.budget.max_frames?)"),
        (["export", "out", "export.fromat=hf"], "unknown key 'export.fromat' (did you mean export.format?)"),
        (["run", "engine=warp"], "engine=warp: no such option of engine; the options are cpu, gpu"),
        (["run", "data=parquet"], "data.path is required with data=parquet: pass data.path=..."),
        (["run", "model=s1_mini"], "model.checkpoint is required with model=s1_mini"),
        (["export"], "output.dir is required: pass `chorus export OUTPUT_DIR`"),
        (["run", "engine.max_rows=0"], "engine.max_rows must be >= 1, got 0"),
        (["run", "engine.max_rows=abc"], "engine.max_rows=abc: Value 'abc' of type 'str' could not be converted"),
        (["run", "output.dir=/sys/chorus-out"], "output.dir='/sys/chorus-out' cannot be written"),
        (["run", "output.dir=afile/out"], "cannot be created: {tmp}/afile is a file; choose another output.dir"),
        (["run", "output.fail_on=[ok]"], "output.fail_on lists the statuses"),
        (["run", "--verbose"], "unknown option '--verbose'"),
        (["run", "stray"], "unexpected argument 'stray'"),
        (["run", "engine.max_rows=1,2"], "one value per key"),
        (["rn"], "unknown command 'rn' (did you mean run?)"),
        ([], "choose a command"),
        (["encode-refs"], "encode_refs.output is required"),
        (["bench"], "choose a benchmark: bench=smoke"),
        (["run", "data=parquet", "data.path=missing.parquet"], "missing.parquet does not exist"),
    ],
)
def test_every_mistake_is_one_line_exit_2_and_leaves_nothing(args, said, tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("")
    monkeypatch.chdir(tmp_path)  # the default output.dir, outputs/demo, would appear here
    assert main(args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert said.format(tmp=tmp_path) in lines[0]
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no output, no _runs/, no probe


def test_python_dash_m_pipeline_is_chorus_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "engine.slots=1"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "did you mean engine.max_rows?" in done.stderr
    helped = subprocess.run(
        [sys.executable, "-m", "pipeline.report", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: chorus report")
