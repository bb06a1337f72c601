"""psbench settings: validation as one-line UserErrors, DMLC_* resolution, and
the flags the launcher passes arriving intact through the CLI."""
import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from core.errors import UserError
from workloads.psbench.cli import app, workload_options
from workloads.psbench.options import NodeConfig, Workload

ENV = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
       "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3", "DMLC_NODE_HOST": "10.1.0.3"}


@pytest.mark.parametrize("bad, flag", [({"server_delay_ms": -1}, "--server-delay-ms"),
                                      ({"keys_per_request": 0}, "--keys-per-request"),
                                      ({"dtype": "int8"}, "--dtype"),
                                      ({"key_space": 10, "keys_per_request": 11}, "--keys-per-request")])
def test_workload_rejects_impossible_values(bad, flag):
    with pytest.raises(UserError, match=flag):
        Workload(**bad)


def test_unknown_option_is_named():
    with pytest.raises(UserError, match="bogus"):
        Workload.from_kwargs(bogus=1)


def test_node_config_from_dmlc_env_and_overrides():
    cfg = NodeConfig.resolve(env=ENV)
    assert (cfg.role, cfg.root_uri, cfg.root_port, cfg.num_servers, cfg.num_workers, cfg.node_host, cfg.port) == \
        ("worker", "127.0.0.1", 9000, 2, 3, "10.1.0.3", 0)
    cfg = NodeConfig.resolve(role="scheduler", num_servers=1, env=ENV)
    assert (cfg.role, cfg.num_servers, cfg.port) == ("scheduler", 1, 9000)  # the scheduler listens on the root port


@pytest.mark.parametrize("drop, var", [("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_URI"), ("DMLC_ROLE", "DMLC_ROLE")])
def test_missing_variable_says_which(drop, var):
    env = {k: v for k, v in ENV.items() if k != drop}
    with pytest.raises(UserError, match=var):
        NodeConfig.resolve(env=env)


def test_bad_values_in_env():
    with pytest.raises(UserError, match="DMLC_NUM_SERVER"):
        NodeConfig.resolve(env={**ENV, "DMLC_NUM_SERVER": "two"})
    with pytest.raises(UserError, match="role"):
        NodeConfig.resolve(env={**ENV, "DMLC_ROLE": "coordinator"})
    with pytest.raises(UserError, match="at least 1 server"):
        NodeConfig.resolve(env={**ENV, "DMLC_NUM_SERVER": "0"})


def test_launcher_flags_round_trip_through_the_cli():
    seen = {}
    probe = typer.Typer()

    @probe.command()
    @workload_options
    def cmd(workload: Workload = None):
        seen["w"] = workload

    want = Workload(key_space=5000, zipf_exponent=0.7, keys_per_request=40, lens=False, rate=250.5,
                    reconnect_every=10, server_jitter_ms=0.25, dtype="float64")
    result = CliRunner().invoke(probe, want.to_argv())
    assert result.exit_code == 0, result.output
    assert dataclasses.asdict(seen["w"]) == dataclasses.asdict(want)


def test_cli_bad_value_exits_nonzero_with_one_message(tmp_path):
    result = CliRunner().invoke(app, ["run", "--servers", "1", "--key-space", "0", "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError) and "--key-space" in str(result.exception)


def test_summary_of_an_empty_dir_is_a_user_error(tmp_path):
    result = CliRunner().invoke(app, ["summary", str(tmp_path)])
    assert isinstance(result.exception, UserError) and "ground truth" in str(result.exception)
