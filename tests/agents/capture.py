"""Capture real coding agents' traffic (agents no rule pack knows) as test data.

Each agent is installed once, at a pinned version, under ``~/.cache/prefixpin``
(``$PREFIXPIN_CACHE``), and run non-interactively against a local scripted
upstream (:mod:`tests.infra.agent_upstream`: it records every request and answers
plausibly, with a tool call where the script says) for two sessions of one
tenant, each over several invocations (the agent resumes the session) across a
change of day (``TZ``: UTC-12 for the first day, UTC+14 for the next, whatever
the time now).  The requests are redacted (the key, the temporary paths, every
header but the ones the proxy reads) and written as an audit trace, gzipped,
one request a line with the reply it got:

    tests/agents/data/<agent>.jsonl.gz

Run ``python -m tests.agents.capture [--agent qwen-code] [--out DIR]``; the
tests replay the files and need no agent.  ``--install`` only installs the agents
(the test command does, for ``tests/e2e/test_qwen_code.py``, which runs the real CLI).  Each line: ``t``, ``path``,
``headers``, ``body``, ``response``, and ``agent``, ``session``, ``invocation``,
``day`` (0 or 1).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.infra.procs import free_port
from tests.infra.wait import wait_until

CACHE = Path(os.environ.get("PREFIXPIN_CACHE", Path.home() / ".cache" / "prefixpin"))
DATA = Path(__file__).parent / "data"
DAYS = ("Etc/GMT+12", "Etc/GMT-14")  # 26 hours apart: two dates at any time of day
KEY = "sk-agent-capture"  # the key the agents send (not a secret), replaced in the data
APP = "def greet(name):\n    print(f'Hello {name}')\n\n\nif __name__ == '__main__':\n    greet('world')\n"


@dataclass(frozen=True)
class Agent:
    """One agent: how to install it and how to run one invocation of a session."""

    name: str
    version: str
    install: Callable[[Path, str], None]
    command: Callable[[Path, bool, str], list[str]]  # (install dir, resume, prompt) -> argv
    env: Callable[[str, Path], dict[str, str]]  # (base url, home) -> environment
    script: list[dict[str, Any]] = field(default_factory=list)  # the upstream's tool calls

    @property
    def home(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"


def _npm(package: str) -> Callable[[Path, str], None]:
    def install(target: Path, version: str) -> None:
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(target), f"{package}@{version}"],
            check=True,
        )

    return install


def _pip(package: str) -> Callable[[Path, str], None]:
    def install(target: Path, version: str) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
        subprocess.run([str(target / "bin" / "pip"), "install", "-q", f"{package}=={version}"], check=True)

    return install


def _qwen(home: Path, resume: bool, prompt: str) -> list[str]:
    exe = home / "node_modules" / ".bin" / "qwen"
    return [str(exe), "--auth-type", "openai", "-m", "m", "--yolo", *(["--continue"] if resume else []), prompt]


def _aider(home: Path, resume: bool, prompt: str) -> list[str]:
    exe = home / "bin" / "aider"
    flags = ["--model", "openai/m", "--edit-format", "diff", "--yes-always", "--no-check-update"]
    flags += ["--no-show-model-warnings", "--no-analytics", "--restore-chat-history", "--no-auto-commits"]
    return [str(exe), *flags, "--message", prompt, "app.py"]


AGENTS = {
    "qwen-code": Agent(
        "qwen-code",
        "0.24.4",
        _npm("@qwen-code/qwen-code"),
        _qwen,
        lambda base, home: {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": base + "/v1", "OPENAI_MODEL": "m"},
        [{"when": "app.py", "tool": "read_file", "arguments": {"file_path": "{work}/app.py"}}],
    ),
    "aider": Agent(
        "aider",
        "0.86.2",
        _pip("aider-chat"),
        _aider,
        lambda base, home: {"OPENAI_API_KEY": KEY, "OPENAI_API_BASE": base + "/v1"},
    ),
}

# Two sessions of one tenant: (session, [(day, prompt), ...]); the first invocation
# starts the session, the others resume it.
SESSIONS = (
    ("a", [(0, "What does app.py do?"), (0, "Make the greeting more casual."), (1, "Thanks. Anything else?")]),
    ("b", [(0, "Is app.py tested?"), (1, "Add a docstring to greet.")]),
)


def ensure(agent: Agent) -> Path:
    """The agent's install dir, installed at its pinned version when missing."""
    marker = agent.home / ".installed"
    if not marker.exists():
        shutil.rmtree(agent.home, ignore_errors=True)
        agent.home.mkdir(parents=True)
        agent.install(agent.home, agent.version)
        marker.touch()
    return agent.home


def capture(agent: Agent, out: Path) -> Path:
    """Run the agent's sessions against a recording upstream; the redacted trace."""
    install = ensure(agent)
    root = Path(tempfile.mkdtemp(prefix="prefixpin-agents-"))
    requests = root / "requests.jsonl"
    lines: list[dict[str, Any]] = []
    try:
        for session, invocations in SESSIONS:
            work, home = root / session / "project", root / session / "home"
            work.mkdir(parents=True)
            home.mkdir(parents=True)
            _project(work)
            script = json.loads(json.dumps(agent.script).replace("{work}", str(work)))
            for n, (day, prompt) in enumerate(invocations):
                requests.unlink(missing_ok=True)
                _invoke(agent, install, work, home, script, requests, day, n > 0, prompt)
                for raw in requests.read_text().splitlines():
                    lines.append(_line(json.loads(raw), agent, session, n, day, len(lines)))
        text = _redact("\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n", root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as fh:
        fh.write(text)
    return out


def _project(work: Path) -> None:
    (work / "app.py").write_text(APP)
    git = ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "add", "."], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=work, check=True)


def _invoke(
    agent: Agent,
    install: Path,
    work: Path,
    home: Path,
    script: list[dict[str, Any]],
    requests: Path,
    day: int,
    resume: bool,
    prompt: str,
) -> None:
    """One invocation against a fresh recording upstream."""
    port = free_port()
    script_file = requests.with_suffix(".script.json")
    script_file.write_text(json.dumps(script))
    argv = [sys.executable, "-m", "tests.infra.agent_upstream", "--port", str(port), "--out", str(requests)]
    upstream = subprocess.Popen([*argv, "--script", str(script_file)], cwd=Path(__file__).parents[2])
    try:
        wait_until(lambda: _up(port), timeout=20, message="the agent upstream did not start")
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "TZ": DAYS[day],
            "NO_COLOR": "1",
            "LANG": "C.UTF-8",
            **agent.env(f"http://127.0.0.1:{port}", home),
        }
        done = subprocess.run(
            agent.command(install, resume, prompt),
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{agent.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


def _up(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _line(rec: dict[str, Any], agent: Agent, session: str, invocation: int, day: int, n: int) -> dict[str, Any]:
    return {
        "t": float(n),
        "path": "/v1/chat/completions",
        "headers": {"authorization": "Bearer sk-redacted"},
        "body": json.loads(rec["raw"]),
        "response": rec["reply"],
        "agent": agent.name,
        "session": session,
        "invocation": invocation,
        "day": day,
    }


def _redact(text: str, root: Path) -> str:
    """The capture's temporary paths as a user's (``/home/user/<session>``), and the key gone."""
    slug = re.sub(r"[^A-Za-z0-9]", "-", str(root))  # how agents name a project's folder
    text = text.replace(str(root), "/home/user").replace(slug, "-home-user")
    return text.replace(KEY, "sk-redacted")


def load(agent: str, data: Path = DATA) -> list[dict[str, Any]]:
    """A captured trace's lines."""
    with gzip.open(data / f"{agent}.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description="Capture real agents' traffic as test data.")
    ap.add_argument("--agent", choices=sorted(AGENTS), action="append")
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument("--install", action="store_true", help="only install the agents (cached), capture nothing")
    args = ap.parse_args()
    for name in args.agent or sorted(AGENTS):
        if args.install:
            print(ensure(AGENTS[name]))
            continue
        path = capture(AGENTS[name], args.out / f"{name}.jsonl.gz")
        print(path, len(load(name, args.out)), "requests")


if __name__ == "__main__":
    main()
