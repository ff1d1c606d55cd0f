"""`draftwheel shadow | promote | rollback | status` against a real sqlite registry in a temp state dir.

The shadow command runs end to end on toy models (tests/evaluation/test_shadow.py explains them): the
"good" draft must pass the gate over the "bad" champion, get registered, aliased and promoted; the
"bad" draft must fail over the good champion, be registered with its failed verdict and move no alias.
The failure paths are in test_registry_probes.py.
"""

from __future__ import annotations

import argparse
import json

import pytest

from draftwheel import registry, tracking
from draftwheel.flows import registry_cli
from draftwheel.registry_names import DRAFT_KIND_TAG, SHADOW_REPORT_TAG, TARGET_SHA_TAG
from tests.conftest import make_champion
from tests.draftwheel.test_tracking import fake_model_dir
from tests.evaluation.test_shadow import toy_models  # noqa: F401 - module-scoped fixture reused here


@pytest.fixture(scope="module")
def home(module_home):
    """This module's own state dir, hence its own sqlite registry."""
    return module_home


def run(*argv: str) -> int:
    """`draftwheel ARGV` through the registry commands' own parser and exit codes."""
    parser = argparse.ArgumentParser(prog="draftwheel")
    registry_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_status_of_an_empty_registry(home, capsys):
    assert run("status") == 0
    assert "(no versions registered)" in capsys.readouterr().out


def test_promote_rollback_status(home, tmp_path, capsys):
    v1, v2 = (tracking.register_draft(fake_model_dir(tmp_path / str(i), f"w{i}".encode()), {TARGET_SHA_TAG: "ab" * 32})
              for i in range(2))
    assert run("rollback") == 1
    assert "no 'previous' version" in capsys.readouterr().err
    assert run("promote", v1) == 0 and run("promote", v2) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"champion": v2, "previous": v1}
    assert run("rollback") == 0
    assert json.loads(capsys.readouterr().out) == {"champion": v1, "previous": v2}
    registry.record_delivered(v1, {"champion": v1, "previous": v2, "slices": {
        "overall": {"champion": {"requests": 12, "acceptance_rate": 0.5, "mean_accepted_length": 1.4},
                    "mal_change": 0.4},
        "code": {"champion": {"requests": 10, "acceptance_rate": 0.5, "mean_accepted_length": 1.5},
                 "previous": {"requests": 9, "acceptance_rate": 0.25, "mean_accepted_length": 1.0}, "mal_change": 0.5,
                 "mal_change_ci": [0.2, 0.81]},
        "chat": {"champion": {"requests": 4, "acceptance_rate": 0.5, "mean_accepted_length": 1.2},  # no interval:
                 "previous": {"requests": 4, "acceptance_rate": 0.5, "mean_accepted_length": 1.2}, "mal_change": 0.0},  # older tag
        "prose": {"champion": {"requests": 2, "acceptance_rate": 0.2, "mean_accepted_length": 1.1},
                  "previous": None, "mal_change": None}}})
    assert run("status") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["model", "version", "aliases", "created", "from", "weights", "target", "shadow",
                                "delivered", "state"]
    rows = {line.split()[1]: line.split()[2] for line in table[1:]}
    assert rows[v1] == "champion" and rows[v2] == "previous"
    delivered = {row["version"]: row["delivered"] for row in registry.status_rows()}
    assert delivered == {v1: "chat 1.20 +0% n=4; code 1.50 +50% [+20%,+81%] n=10; prose 1.10 n=2", v2: "-"}
    assert run("promote", "999") == 1
    assert "999" in capsys.readouterr().err
    assert tracking.aliases() == {"champion": v1, "previous": v2}


def test_status_leads_with_the_gain_as_served(home, tmp_path):
    """A hybrid champion's delivered cell: the figure over every step (as users got it) first, the draft's
    own steps in brackets."""
    version = tracking.register_draft(fake_model_dir(tmp_path / "v", b"w"), {TARGET_SHA_TAG: "ab" * 32})
    alone = {"champion": {"requests": 10, "acceptance_rate": 0.5, "mean_accepted_length": 1.5},
             "previous": {"requests": 9, "acceptance_rate": 0.25, "mean_accepted_length": 1.0}, "mal_change": 0.5}
    served = {"champion": {"requests": 10, "acceptance_rate": 0.6, "mean_accepted_length": 2.8},
              "previous": {"requests": 9, "acceptance_rate": 0.6, "mean_accepted_length": 2.9}, "mal_change": -0.04}
    registry.record_delivered(version, {"champion": version, "previous": None, "slices": {"code": alone},
                                        "as_served": {"code": served}})
    delivered = {row["version"]: row["delivered"] for row in registry.status_rows()}
    assert delivered[version] == "code as served 2.80 -4% n=10 (draft alone 1.50 +50%)"


def test_shadow_gate_registers_and_promotes(home, toy_models, tmp_path, capsys):  # noqa: F811
    models, holdout, _ = toy_models
    target, good, bad = (str(models[n].path) for n in ("target", "good", "bad"))
    champion = tracking.register_draft(bad, {TARGET_SHA_TAG: models["target"].model_id.sha256})
    make_champion(champion)
    common = ["--target", target, "--holdout", str(holdout), "--set", "include_canary=false",
              "--set", "min_requests=4", "--set", "max_requests=4", "--set", "bootstrap_resamples=200"]
    out = tmp_path / "pass.json"
    assert run("shadow", "--challenger", good, "--out", str(out), "--promote", *common) == 0
    assert "shadow: PROMOTE" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["decision"]["promote"] and report["champion"]["version"] == champion
    new = tracking.get_alias_version("champion")
    assert new != champion and tracking.aliases() == {"champion": new, "challenger": new, "previous": champion}
    tags = tracking.get_version_tags(new)
    assert tags[TARGET_SHA_TAG] == models["target"].model_id.sha256
    assert tags[DRAFT_KIND_TAG] == "lm"  # registered as bootstrap and the flywheel register (register_version)
    assert json.loads(tags[SHADOW_REPORT_TAG])["gain"]["ci_low"] == report["overall"]["difference"]["ci_low"]

    # The bad draft against the new (good) champion: rejected; registered with its verdict, no alias moved.
    before = tracking.aliases()
    out = tmp_path / "fail.json"
    assert run("shadow", "--challenger", bad, "--out", str(out), "--promote", "--no-tracking", *common) == 3
    assert "shadow: REJECT" in capsys.readouterr().out
    assert not json.loads(out.read_text())["decision"]["promote"]
    assert tracking.aliases() == before
    assert run("status") == 0
    status = capsys.readouterr().out
    assert "pass +" in status and "fail " in status



def test_status_shows_the_retained_corpus(home, capsys):
    from datasets import Dataset

    from draftwheel.home import state_dir
    from draftwheel.mining.corpus import CorpusPolicy, retain
    from draftwheel.mining.outputs import DISTILL

    assert run("status") == 0
    assert "retained corpus: empty" in capsys.readouterr().out
    rows = [{"prompt": p, "completion": "x", "prompt_token_ids": [1], "completion_token_ids": [2], "slice": s,
             "weight": 1.0, "served_residual": [1.0]} for p, s in (("a", "code"), ("b", "code"), ("c", "sql"))]
    Dataset.from_list(rows, features=DISTILL).save_to_disk(str(state_dir() / "mined"))
    retain(state_dir() / "corpus", state_dir() / "mined", CorpusPolicy())
    assert run("status") == 0
    out = capsys.readouterr().out
    assert "retained corpus: 3 rows (code 2, sql 1)\n" in out  # no round has recorded its traffic's end
    retain(state_dir() / "corpus", state_dir() / "mined", CorpusPolicy(), newest_ts=1796558400.0)
    assert run("status") == 0
    assert "retained corpus: 3 rows (code 2, sql 1); the next round mines the traffic logged after " \
           "2026-12-06T12:00:00+00:00" in capsys.readouterr().out


def test_status_shows_the_suffix_index_the_server_wrote(home, capsys):
    from draftwheel.serving.server.serving_state import serving_dir, write_suffix_stats
    from draftwheel.serving.engine.suffix import SuffixIndex

    assert run("status") == 0
    assert "suffix index: none written" in capsys.readouterr().out.splitlines()[-1]
    index = SuffixIndex("target-sha")
    index.add([1, 2, 3, 4])
    write_suffix_stats(index, serving_dir())
    assert run("status") == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("suffix index: 1 requests, 4 tokens; hit rate 0.0% of 0 steps")
    assert run("status", "--json") == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)  # --json stays the rows alone
    (serving_dir() / "suffix_stats.json").unlink()
