"""Claude Code and Codex CLI, from npm, through a real `gateway serve` in front of the emulator.

Each agent gets one task that makes it call its shell tool and then answer: the emulator
(`tool_call`, `tool_name`) asks for the tool with a command whose output only a shell can
produce (`agent-ran-42` from `$((6*7))`), and answers with text once the conversation ends with
the tool's result. So a pass proves the whole loop through the gateway, in the agent's own API
(Anthropic Messages for Claude Code, OpenAI Responses for Codex), in front of either upstream
dialect: the streamed call arrived as a call under the agent's own tool name, the agent ran it,
its result reached the model server, and the final answer reached the agent's output.

Both run offline, with the settings docs/clients.md gives (../shared/reference/agent-clients.md):
`HTTP(S)_PROXY` point at a loopback listener that counts connections, and the test asserts it
saw none, so any attempt to reach the internet (telemetry, updates, plugin sync) fails the test.

The clients come from requirements/npm/ (installed by scripts/npm-clients into .venv/npm):
skipped with a reason when missing, failing under CI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.testing.stack import create_key, gateway_process
from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.metrics import metric_value
from tests.support.servers import in_ci
from tests.support.stack import Emulator

pytestmark = [pytest.mark.clients, pytest.mark.processes]

NPM_BIN = Path(__file__).resolve().parents[2] / ".venv" / "npm" / "node_modules" / ".bin"
COMMAND = "echo agent-ran-$((6*7))"  # only a shell turns this into agent-ran-42
RAN = "agent-ran-42"
TEXT = "".join(f"tok{i} " for i in range(16))  # the emulator's answer


def _client(name: str) -> Path:
    path = NPM_BIN / name
    if not path.exists():
        reason = f"{path} is missing: scripts/npm-clients installs it (needs npm)"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return path


class ConnectionTrap:
    """A loopback listener that accepts and closes connections, counting them (a dead proxy)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.count = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self.count += 1
            connection.close()

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def trap() -> Iterator[ConnectionTrap]:
    listener = ConnectionTrap()
    yield listener
    listener.close()


@pytest.fixture(params=["ollama", "openai"])
def served(
    request: pytest.FixtureRequest, emulator: Emulator, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """(URL, key) of `gateway serve` in front of the emulator in one upstream dialect."""
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_UPSTREAM_DIALECT": request.param,
        "GATEWAY_FIRST_BYTE_TIMEOUT": "60",
        "GATEWAY_IDLE_TIMEOUT": "60",
    }
    with gateway_process(tmp_path, env) as process:
        key = str(create_key(process.extra_env, "agent")["key"])
        yield process.url, key


def _offline_env(home: Path, trap: ConnectionTrap) -> dict[str, str]:
    """A clean environment: its own HOME, every proxy the counting trap, loopback direct."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HTTP_PROXY": trap.url,
        "HTTPS_PROXY": trap.url,
        "http_proxy": trap.url,
        "https_proxy": trap.url,
        "ALL_PROXY": trap.url,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(  # noqa: S603 - the pinned client and fixed arguments
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=240, check=False
    )


def _tool_result_reached_upstream(emulator: Emulator) -> bool:
    """Whether a request to the model server carried the shell's output (a tool result)."""
    return any(RAN in json.dumps(record.body) for record in emulator.state.records)


def _completed(url: str, route: str) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics").text
    return metric_value(text, "gateway_requests_total", route=route, outcome="completed")


@pytest.mark.slow
def test_claude_code_runs_its_bash_tool_through_the_gateway(
    served: tuple[str, str], emulator: Emulator, trap: ConnectionTrap, tmp_path: Path
) -> None:
    url, key = served
    claude = _client("claude")
    emulator.config.tool_call = True
    emulator.config.tool_name = "Bash"
    emulator.config.tool_arguments = {"command": COMMAND, "description": "Print a marker"}
    env = {
        **_offline_env(tmp_path / "home", trap),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_AUTH_TOKEN": key,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    argv = [str(claude), "-p", "Print the marker with Bash, then answer.", "--model", MODEL]
    result = _run([*argv, "--allowedTools", "Bash"], env, tmp_path / "work")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _tool_result_reached_upstream(emulator), "the Bash tool's output never came back"
    assert TEXT.strip() in result.stdout  # the final answer, after the tool's result
    assert _completed(url, "/v1/messages") >= 2  # the call turn and the answer turn
    assert trap.count == 0, "Claude Code tried to reach the internet"


def _codex_home(path: Path, url: str) -> Path:
    """`$CODEX_HOME` with the gateway as the only provider and every network feature off."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(
        f"""model = "{MODEL}"
model_provider = "gateway"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.gateway]
name = "gateway"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "GATEWAY_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
remote_plugin = false
apps = false

[analytics]
enabled = false

[feedback]
enabled = false
""",
        encoding="utf-8",
    )
    return path


@pytest.mark.slow
def test_codex_runs_its_shell_tool_through_the_gateway(
    served: tuple[str, str], emulator: Emulator, trap: ConnectionTrap, tmp_path: Path
) -> None:
    url, key = served
    codex = _client("codex")
    emulator.config.tool_call = True
    emulator.config.tool_name = "exec_command"
    emulator.config.tool_arguments = {"cmd": COMMAND}
    env = {
        **_offline_env(tmp_path / "home", trap),
        "CODEX_HOME": str(_codex_home(tmp_path / "codex", url)),
        "GATEWAY_API_KEY": key,
    }
    # No sandbox: Codex's needs bubblewrap and user namespaces, which a CI container may lack;
    # the command is the test's own.
    argv = [str(codex), "exec", "--skip-git-repo-check"]
    argv += ["--dangerously-bypass-approvals-and-sandbox", "Print the marker, then answer."]
    result = _run(argv, env, tmp_path / "work")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _tool_result_reached_upstream(emulator), "the shell tool's output never came back"
    assert TEXT.strip() in result.stdout
    assert _completed(url, "/v1/responses") >= 2
    assert trap.count == 0, "Codex tried to reach the internet"
