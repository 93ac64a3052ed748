"""The recorder config file: good files parse, every mistake names the file, the entry and the problem."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from recording_helpers import REPLAY_SIM

from replay_sim.errors import ConfigError
from replay_sim.record.config_file import load_config

GOOD = """
[redaction]
keys = ["*token*", "authorization"]
patterns = ["ghp_[A-Za-z0-9]{36}"]

[servers.git]
command = "mcp-server-git"
args = ["--repository", "."]
env = { GIT_TOKEN = "${RS_TEST_TOKEN}" }
timeout = 30
explore = true

[servers.remote]
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer ${RS_TEST_TOKEN}" }
"""


def test_a_good_config_parses_with_env_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RS_TEST_TOKEN", "tok-123456")
    path = tmp_path / "record.toml"
    path.write_text(GOOD)
    config = load_config(path)
    assert config.servers["git"].command == "mcp-server-git"
    assert config.servers["git"].args == ("--repository", ".")
    assert config.servers["git"].env == {"GIT_TOKEN": "tok-123456"}
    assert config.servers["git"].timeout == 30
    assert config.servers["git"].explore and not config.servers["remote"].explore
    assert config.servers["remote"].headers == {"Authorization": "Bearer tok-123456"}
    assert config.redactor.is_secret_key("X-Auth-Token") and not config.redactor.is_secret_key("password")
    assert config.redactor.redact("ghp_" + "a" * 36) == "[REDACTED]"


def test_the_shipped_example_config_parses() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "server" / "record.example.toml")
    assert config.servers


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("servers = [", r"not valid TOML"),
        ("", r"no upstreams"),
        ("[servers.a]\ncommand = 'x'\nurl = 'http://h/mcp'", r"\[servers\.a\]: needs exactly one of"),
        ("[servers.a]\nargs = ['x']", r"\[servers\.a\]: needs exactly one of"),
        (
            "[servers.a]\ncommand = 'x'\nargs = 'not a list'",
            r"\[servers\.a\]: 'args' must be a list of strings",
        ),
        ("[servers.a]\ncommand = 'x'\nenv = { K = 1 }", r"\[servers\.a\]: env\.K must be a string"),
        ("[servers.a]\ncommand = 'x'\ncomand = 'typo'", r"\[servers\.a\]: unknown key\(s\) \['comand'\]"),
        ("[servers.a]\nurl = 'ftp://h/mcp'", r"\[servers\.a\]: 'url' must start with http"),
        ("[servers.a]\nurl = 'http://h/mcp'\nargs = []", r"\[servers\.a\]: 'args' applies to a command"),
        (
            "[servers.a]\ncommand = 'x'\ntimeout = -1",
            r"\[servers\.a\]: 'timeout' must be a positive, finite number",
        ),
        (
            "[servers.a]\ncommand = 'x'\ntimeout = nan",
            r"\[servers\.a\]: 'timeout' must be a positive, finite",
        ),
        (
            "[servers.a]\ncommand = 'x'\ntimeout = inf",
            r"\[servers\.a\]: 'timeout' must be a positive, finite",
        ),
        (
            "[servers.a]\ncommand = 'x'\nstartup_timeout = nan",
            r"\[servers\.a\]: 'startup_timeout' must be a positive, finite",
        ),
        ("[servers.a]\ncommand = 'x'\nexplore = 'yes'", r"\[servers\.a\]: 'explore' must be true or false"),
        ("[servers.a]\ncommand = 'x'\nsandbox = 1", r"\[servers\.a\]: 'sandbox' must be true or false"),
        (
            "[servers.a]\nurl = 'http://h/mcp'\nsandbox = true",
            r"\[servers\.a\]: 'sandbox' needs a 'reset' command",
        ),
        (
            "[servers.a]\ncommand = 'x'\nenv = { K = '${RS_NOT_SET_ANYWHERE}' }",
            r"env\.K: environment variable",
        ),
        ("[servers.'a b']\ncommand = 'x'", r"\[servers\.a b\]: a server name may use only"),
        (
            "[servers.a]\ncommand = 'x'\n[redaction]\npatterns = ['(unclosed']",
            r"\[redaction\]: pattern '\(unclosed'",
        ),
        ("[servers.a]\ncommand = 'x'\n[redaction]\nkeys = 'token'", r"\[redaction\]: 'keys' must be a list"),
        ("[server.a]\ncommand = 'x'", r"unknown top-level key\(s\) \['server'\]"),
    ],
)
def test_a_bad_config_names_the_file_the_entry_and_the_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--config", "CONFIG"], "'timeout' must be a positive, finite number of seconds, not nan"),
        (["--timeout", "nan", "--name", "t", "--", "true"], "'nan' is not a finite number of seconds"),
        (["--timeout", "inf", "--name", "t", "--", "true"], "'inf' is not a finite number of seconds"),
    ],
    ids=["config nan", "option nan", "option inf"],
)
def test_record_refuses_a_timeout_of_nan_or_inf_naming_the_field(
    tmp_path: Path, arguments: list[str], said: str
) -> None:
    config = tmp_path / "record.toml"
    config.write_text("[servers.a]\ncommand = 'true'\ntimeout = nan\n")
    command = [REPLAY_SIM, "record", "--db", str(tmp_path / "rec.db")]
    command += [str(config) if a == "CONFIG" else a for a in arguments]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert ran.returncode != 0 and said in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert "'timeout'" in ran.stderr or "'--timeout'" in ran.stderr
