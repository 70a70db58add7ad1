"""`tuned reload`'s reading of where to send the reload: every data-parallel rank's
endpoint and the reload token, from the config file even when that file is the
invalid one the running tuned will refuse. tests/deploy/test_reload_command.py runs
the command against tuned's real endpoint (the unit's ExecReload line)."""

from __future__ import annotations

import argparse
import io

from tuned.commands import reload as reload_mod
from tuned.commands.endpoint import DEFAULT_URL


def test_a_url_names_one_rank_and_no_token():
    assert reload_mod.reload_targets(None, "127.0.0.1:9500/decisions") == (
        ["http://127.0.0.1:9500"], "")
    assert reload_mod.reload_targets(None, None) == ([DEFAULT_URL], "")


def test_every_data_parallel_rank_and_the_token_come_from_the_file(tmp_path):
    path = tmp_path / "tuned.toml"
    path.write_text('metrics_port = 9600\nreload_token = "s3cret"\n'
                    'vllm_args = ["--data-parallel-size", "3"]\n')
    assert reload_mod.reload_targets(str(path), None) == (
        ["http://127.0.0.1:9600", "http://127.0.0.1:9601", "http://127.0.0.1:9602"], "s3cret")


def test_an_invalid_config_still_names_its_endpoint(tmp_path):
    # b_min above the ceiling: the running tuned refuses this file, the reload must reach it
    path = tmp_path / "tuned.toml"
    path.write_text("metrics_port = 9700\nb_min = 100\nmax_num_seqs = 8\n")
    assert reload_mod.reload_targets(str(path), None) == (["http://127.0.0.1:9700"], "")


def test_a_file_that_is_not_toml_is_read_line_by_line(tmp_path):
    # one broken line; the endpoint's keys on the others are read, a bad one at its default
    path = tmp_path / "tuned.toml"
    path.write_text('metrics_port = 9800\ninterval_s = = 1\nmetrics_host = 7\n'
                    '[table]\nreload_token = "not top-level"\n')
    assert reload_mod.reload_targets(str(path), None) == (["http://127.0.0.1:9800"], "")


def test_config_and_url_together_are_a_usage_error(capsys):
    args = argparse.Namespace(config="tuned.toml", url="127.0.0.1:9464", timeout=1.0)
    assert reload_mod.cmd_reload(args) == 2
    assert capsys.readouterr().err == ("tuned reload: --config and --url both name the "
                                       "endpoint; give one\n")


def test_nothing_answering_is_exit_3_with_one_line(tmp_path):
    from tuned.base.netutil import free_port

    url = f"http://127.0.0.1:{free_port()}"
    out, err = io.StringIO(), io.StringIO()
    assert reload_mod.reload(url=url, timeout_s=2.0, out=out, err=err) == 3
    assert out.getvalue() == ""
    assert err.getvalue() == (f"tuned reload: nothing answers at {url} (connection "
                              "refused); is tuned running and is this its "
                              "metrics_host:metrics_port?\n")
