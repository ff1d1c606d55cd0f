"""`draftwheel mine` on bad input: one line naming the field or the path, exit code 2, no traceback
(a hostile probe). The successful command is covered in test_workloads_traffic.py."""

from __future__ import annotations

import pytest

from draftwheel.flows.commands import main
from tests.mining.conftest import make_record, write_lines


@pytest.fixture()
def logs(tmp_path):
    return write_lines(tmp_path / "logs" / "acceptance.jsonl", [make_record(i, ts=1.7e9 + i) for i in range(5)]).parent


@pytest.mark.parametrize("override, field", [
    (["--set", "holdout_fraction=2"], "holdout_fraction"),
    (["--set", "since=yesterday"], "since"),
    (["holdout_fraction=2"], "holdout_fraction"),  # the positional form the other commands use
    (["--set", "no_such_field=1"], "no_such_field"),
])
def test_bad_config_values_are_one_line_naming_the_field(logs, tmp_path, capsys, override, field):
    assert main(["mine", "--log-dir", str(logs), "--out", str(tmp_path / "out"), *override]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_unwritable_out_dir_is_one_line_naming_the_path(logs, capsys, read_only_dir):
    locked = read_only_dir
    code = main(["mine", "--log-dir", str(logs), "--out", str(locked / "out"), "--set", "plot=false"])
    err = capsys.readouterr().err
    assert code == 2 and str(locked / "out") in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_missing_logs_are_one_line_naming_the_path(tmp_path, capsys):
    assert main(["mine", "--log-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nope") in err and len(err.strip().splitlines()) == 1


def test_an_alias_bomb_in_slices_is_one_line_naming_the_file(logs, tmp_path, capsys, alias_bomb):
    """`slices:` holding 9**9 strings once expanded: refused from the token stream, before mining starts."""
    bomb = alias_bomb("slices")
    assert main(["mine", "--config", str(bomb), "--log-dir", str(logs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(bomb) in err and "anchors and aliases" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_log_dir_is_the_flag_and_logs_a_deprecated_alias(logs, capsys):
    from draftwheel.flows.commands import build_parser

    parser = build_parser()
    assert parser.parse_args(["mine", "--log-dir", str(logs)]).log_dir == logs
    assert capsys.readouterr().err == ""
    assert parser.parse_args(["mine", "--logs", str(logs), "hard_quantile=0.5"]).log_dir == logs  # old scripts
    assert "--logs is deprecated, use --log-dir" in capsys.readouterr().err
    assert parser.parse_args(["mine"]).log_dir is None  # $DRAFTWHEEL_HOME/logs
    with pytest.raises(SystemExit):
        parser.parse_args(["mine", "--help"])
    assert "--logs" not in capsys.readouterr().out  # hidden: the help shows one spelling
