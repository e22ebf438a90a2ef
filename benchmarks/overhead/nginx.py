"""nginx, in two roles: the instant upstream and the reference proxy.

Both run one worker in the foreground, each with its own prefix (config, pid,
logs, temp dirs) in the run's temp dir:

    nginx-upstream.conf.tmpl   ``return 200`` of one chat completion with usage
    nginx-proxy.conf.tmpl      ``proxy_pass`` to the upstream, upstream keepalive,
                               ``proxy_buffering off``: what prefixpin is compared with

Debian's nginx-light is installed (as root) when ``nginx`` is missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from string import Template

from benchmarks.overhead.body import MODEL
from benchmarks.overhead.mix import REPLY
from benchmarks.overhead.targets import Target, one_line
from benchmarks.overhead.tools import HERE, Unavailable, ensure_deb
from tests.infra.procs import Proc, free_port

PROMPT_TOKENS = 11_000  # about what a 45 KB hermes body is in tokens; the number itself matters to no one


def binary() -> str:
    return ensure_deb("nginx", "nginx-light", candidates=("/usr/sbin/nginx",))


def reply() -> str:
    """The upstream's answer: a non-streamed chat completion whose text is the mix's assistant turn."""
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1_780_000_000,
            "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": 10,
                "total_tokens": PROMPT_TOKENS + 10,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


def start(name: str, template: str, work: Path, log_dir: Path, **subs: object) -> tuple[Proc, str]:
    """nginx with ``template`` rendered into ``work/name``; (its process, its base URL)."""
    prefix = work / name
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    port = free_port()
    conf = Template((HERE / template).read_text()).substitute(prefix=prefix, port=port, **subs)
    (prefix / "nginx.conf").write_text(conf)
    argv = [binary(), "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")]
    proc = Proc(name, argv, log_dir)
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(base + "/health", timeout=20)
    except RuntimeError as exc:
        proc.stop()
        log = prefix / "error.log"
        tail = log.read_text(errors="replace")[-300:] if log.exists() else ""
        raise Unavailable(f"{name} did not start: {one_line(str(exc))} {tail}") from exc
    return proc, base


def upstream(work: Path, log_dir: Path) -> tuple[Proc, str]:
    """The instant upstream (``return 200``; the reply has no quote or dollar nginx would read)."""
    text = reply()
    assert "'" not in text and "$" not in text and "\\" not in text
    return start("nginx-upstream", "nginx-upstream.conf.tmpl", work, log_dir, reply=text)


def proxy(upstream_base: str, work: Path) -> Target:
    """The reference: nginx ``proxy_pass`` to ``upstream_base`` with one worker."""

    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        port = upstream_base.rsplit(":", 1)[1]
        proc, base = start("nginx", "nginx-proxy.conf.tmpl", work, log_dir, upstream_port=port)
        return [proc], base

    return Target("nginx", launch)


__all__ = ["binary", "proxy", "reply", "start", "upstream"]
