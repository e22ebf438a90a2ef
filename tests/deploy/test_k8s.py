"""Kubernetes manifests: every one validates offline (kubernetes-validate, strict),
and the sidecar pod runs for real with ``podman kube play``."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import local, run, running_containers, save_logs, wait_ready
from tests.infra.conversation import cached, two_turns
from tests.infra.llama import cache_lock
from tests.infra.procs import REPO, free_port

K8S = REPO / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
SIDECAR = K8S / "sidecar.yaml"
KUBERNETES_VERSION = "1.34.0"  # a version kubernetes-validate 1.37.0 ships schemas for

pytestmark = pytest.mark.deploy


def _validator() -> str:
    found = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    assert Path(found).exists(), "kubernetes-validate is not installed (requirements-dev.lock pins it)"
    return found


def test_manifests_exist() -> None:
    assert {p.name for p in MANIFESTS} >= {"sidecar.yaml", "service.yaml"}


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_manifest_validates(manifest: Path) -> None:
    out = run([_validator(), "--strict", "-k", KUBERNETES_VERSION, str(manifest)], check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "INFO" in out.stdout and "ERROR" not in out.stdout, out.stdout


def test_service_manifest_shape(tmp_path: Path) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((K8S / "service.yaml").read_text())}
    deploy = docs[("Deployment", "prefixpin")]
    assert deploy["spec"]["replicas"] >= 2
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    config = yaml.safe_load(docs[("ConfigMap", "prefixpin-config")]["data"]["config.yaml"])
    assert config["store"]["backend"] == "redis"
    assert ("Service", "prefixpin") in docs and ("Service", "redis") in docs
    assert ("PodDisruptionBudget", "prefixpin") in docs
    assert docs[("PodDisruptionBudget", "prefixpin")]["spec"]["minAvailable"] < deploy["spec"]["replicas"]
    # the config the ConfigMap carries is one prefixpin accepts
    path = tmp_path / "config.yaml"
    path.write_text(docs[("ConfigMap", "prefixpin-config")]["data"]["config.yaml"])
    run([sys.executable, "-m", "proxy.cli", "check-config", str(path)])


@dataclass(frozen=True)
class Sidecar:
    pod: str
    port: int  # the host port prefixpin is published on
    manifest: Path  # the copy played


@pytest.fixture
def sidecar(images: list[str], log_dir: Path, tmp_path: Path) -> Iterator[Sidecar]:
    """deploy/k8s/sidecar.yaml played, its hostPort (8787) moved to a free one: podman
    4.3's ``kube play`` has no ``--publish``, and a ``prefixpin serve`` left running on
    8787 (the README's first command) would take the test's requests.  The pod's name is
    the manifest's: two test runs on one host take turns (a lock in the cache dir)."""
    with cache_lock("deploy-sidecar"):  # another test run's pod: its turn ends first
        port = free_port()
        manifest = tmp_path / "sidecar.yaml"
        text = SIDECAR.read_text()
        assert text.count("hostPort: 8787") == 1
        manifest.write_text(text.replace("hostPort: 8787", f"hostPort: {port}"))
        run(["podman", "kube", "down", str(manifest)], check=False)  # an interrupted run's pod
        run(["podman", "kube", "play", str(manifest)], timeout=300)
        try:
            wait_ready(local(port))
            yield Sidecar("prefixpin-sidecar", port, manifest)
        finally:
            if run(["podman", "pod", "exists", "prefixpin-sidecar"], check=False).returncode == 0:  # the test failed
                save_logs(log_dir, ["prefixpin-sidecar-llama", "prefixpin-sidecar-prefixpin"])
                run(["podman", "kube", "down", str(manifest)], check=False)


@pytest.mark.slow
def test_sidecar_pod_with_podman_kube_play(sidecar: Sidecar) -> None:
    first, second, roles = two_turns(local(sidecar.port))
    assert roles == ["root", "continuation"]
    assert cached(second) > 0, second
    assert cached(second) >= first.prompt_tokens // 2, (first, second)
    # prefixpin talks to llama-server over the pod's localhost; only its port is published.
    inspected = run(["podman", "pod", "inspect", sidecar.pod, "--format", "{{json .InfraConfig.PortBindings}}"])
    bindings = json.loads(inspected.stdout)
    assert list(bindings) == ["8787/tcp"], bindings
    assert [(b["HostIp"], b["HostPort"]) for b in bindings["8787/tcp"]] == [("127.0.0.1", str(sidecar.port))], bindings

    run(["podman", "kube", "down", str(sidecar.manifest)])
    assert run(["podman", "pod", "exists", sidecar.pod], check=False).returncode != 0
    assert not [n for n in running_containers() if n.startswith("prefixpin-sidecar")]


def test_redis_cluster_manifest_shape(tmp_path: Path) -> None:
    """The cluster case: 6 Redis nodes, prefixpin in cluster mode as the ACL user the
    end-to-end tests use, its config one prefixpin accepts."""
    from tests.e2e.test_redis_topologies import ACL

    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((K8S / "redis-cluster.yaml").read_text())}
    assert docs[("StatefulSet", "redis-cluster")]["spec"]["replicas"] == 6
    users = docs[("Secret", "redis-cluster-users")]["stringData"]
    assert ACL.format(password="change-me-prefixpin") in users["users.acl"].splitlines()
    assert users["prefixpin-url"].startswith("redis://prefixpin:change-me-prefixpin@")
    text = docs[("ConfigMap", "prefixpin-cluster-config")]["data"]["config.yaml"]
    config = yaml.safe_load(text)
    assert config["store"]["redis_mode"] == "cluster" and len(config["store"]["redis_nodes"]) == 5
    (container,) = docs[("Deployment", "prefixpin-cluster")]["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {e["name"] for e in container["env"]} == {"PREFIXPIN_REDIS_URL"}
    path = tmp_path / "config.yaml"
    path.write_text(text)
    run([sys.executable, "-m", "proxy.cli", "check-config", str(path)])
