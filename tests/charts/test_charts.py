#!/usr/bin/env python3
"""The packaging: Helm charts, the install manifests rendered from them, the Dockerfiles.

Renders charts/trainhub and charts/trainspoke with a real Helm engine (helm-python-sdk embeds
Helm v4; no helm binary) for their default values and for every values file in charts/*/ci/,
runs Helm's lint, validates every rendered object against the Kubernetes schemas
(kubernetes-validate), checks that invalid values fail naming the value, that the CRDs in the
chart are manifests/crds/ (generated from the API types), that manifests/install/ is what the
charts render, that the Deployments start the binaries with flags those binaries accept, and
that each Dockerfile builds a binary of the workspace as a non-root user.

    pip install helm-python-sdk kubernetes-validate
    python3 tests/charts/test_charts.py            # the checks
    python3 tests/charts/test_charts.py --update   # rewrite manifests/install/

The binaries' flags come from their clap definitions (`#[arg(long ...)]` fields of
hub/src/bin/trainhub.rs, hub/src/hub.rs, hub/src/dispatch/mod.rs and spoke/src/cli.rs), plus the spoke flags
announced by other branches (ANNOUNCED_SPOKE_FLAGS) until the source defines them. When
TRAINHUB_BIN and TRAINSPOKE_BIN name built binaries (the Rust wrapper, hub/tests/e2e/charts.rs,
sets them), the rendered hub and (process-backend) spoke Deployments are also run as local
processes with their args: the hub must serve with the built-in runtimes installed and the spoke
must join it (skipped while the spoke's args use announced flags it does not define yet).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "charts"
INSTALL = ROOT / "manifests" / "install"
RBAC_REFERENCE = ROOT / "manifests" / "rbac" / "trainspoke-clusterrole.yaml"
REGENERATE = "python3 tests/charts/test_charts.py --update"

# The oldest Kubernetes the charts are validated against, and the newest the validator ships.
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]

# Custom resources of other projects: no schema ships with kubernetes-validate; their fields
# are checked by cross-references below instead (ports, Secrets, issuers).
FOREIGN_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator CRD",
    ("cert-manager.io/v1", "Certificate"): "cert-manager CRD",
    ("cert-manager.io/v1", "Issuer"): "cert-manager CRD",
}

# Each chart: release name and namespace of its install manifest, and the values a default
# install needs (the spoke cannot guess its hub or certificate).
CHARTS_UNDER_TEST = {
    "trainhub": {"namespace": "trainhub-system", "required": {}},
    "trainspoke": {
        "namespace": "trainspoke-system",
        "required": {
            "hub": {"address": "https://trainhub-grpc.example.com:6444"},
            "tls": {"existingSecret": "trainspoke-tls"},
        },
    },
}

IMAGES = {"trainhub": ROOT / "hub" / "Dockerfile", "trainspoke": ROOT / "spoke" / "Dockerfile"}

# The order `kubectl apply -f` needs (namespaces and CRDs before what uses them).
KIND_ORDER = [
    "Namespace", "CustomResourceDefinition", "ServiceAccount", "Secret", "ConfigMap",
    "PersistentVolumeClaim", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy",
]


def merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def cases(chart: str) -> list[tuple[str, dict]]:
    """(label, values) to render: the defaults, then each ci/ values file."""
    required = CHARTS_UNDER_TEST[chart]["required"]
    out = [("default values", required)]
    for path in sorted((CHARTS / chart / "ci").glob("*.yaml")):
        out.append((str(path.relative_to(ROOT)), merge(required, yaml.safe_load(path.read_text()))))
    return out


def render(chart: str, values: dict | None) -> list[tuple[str, dict]]:
    """(template, object) of every rendered object, NOTES.txt left out (fresh copies: callers may
    change them)."""
    return copy.deepcopy(_render(chart, json.dumps(values, sort_keys=True)))


@functools.cache
def _render(chart: str, values_json: str) -> list[tuple[str, dict]]:
    values = json.loads(values_json)
    with helm.Chart.load(str(CHARTS / chart)) as loaded:
        manifests = loaded.render(
            values, name=chart, namespace=CHARTS_UNDER_TEST[chart]["namespace"], is_install=True
        )
    objects = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            continue
        for obj in yaml.safe_load_all(text):
            if obj:
                objects.append((template, obj))
    return objects


def install_manifest(chart: str) -> str:
    namespace = CHARTS_UNDER_TEST[chart]["namespace"]
    objects = [obj for _, obj in render(chart, CHARTS_UNDER_TEST[chart]["required"])]
    objects.insert(0, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    objects.sort(key=lambda o: KIND_ORDER.index(o["kind"]) if o["kind"] in KIND_ORDER else len(KIND_ORDER))
    header = (
        f"# Generated from charts/{chart} (release {chart}, namespace {namespace}) by\n"
        f"# `{REGENERATE}`; do not edit.\n"
    )
    header += {
        "trainhub": "# Create Secrets trainhub-tls and trainhub-tokens first, and set the image (docs/install.md).\n",
        "trainspoke": "# Set --hub to your hub's gRPC endpoint, create Secret trainspoke-tls first, and set the\n# image (docs/install.md).\n",
    }[chart]
    body = "---\n".join(yaml.safe_dump(o, sort_keys=False, width=100) for o in objects)
    return header + "---\n" + body


class ValidationFailure(AssertionError):
    pass


def validate_object(obj: dict, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        raise ValidationFailure(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {e.message}") from None


# --- the binaries' flags ----------------------------------------------------------------------

class Flags:
    """The long flags a command accepts: name -> possible values (None: any; False: no value)."""

    def __init__(self, flags: dict[str, object], source: str):
        self.flags = flags
        self.source = source

    @staticmethod
    def from_sources(paths: list[Path]) -> "Flags":
        """Fields under `#[arg(long ...)]` in clap-derive structs, with their aliases and the
        values of a literal `value_parser = [...]` list."""
        flags: dict[str, object] = {}
        for path in paths:
            text = path.read_text()
            for m in re.finditer(r"#\[arg\(((?s:.)*?)\)\]\s*(?:///[^\n]*\n\s*)*(?:pub\s+)?(\w+)\s*:\s*([^,\n]+)", text):
                attrs, field, ty = m.group(1), m.group(2), m.group(3)
                if not re.search(r"\blong\b", attrs):
                    continue
                named = re.search(r'long\s*=\s*"([^"]+)"', attrs)
                name = named.group(1) if named else field.replace("_", "-")
                values = re.search(r"value_parser\s*=\s*\[([^\]]*)\]", attrs)
                accepted = re.findall(r'"([^"]+)"', values.group(1)) if values else None
                for flag in [name, *re.findall(r'alias\s*=\s*"([^"]+)"', attrs)]:
                    flags[flag] = False if ty.strip() == "bool" else accepted
        return Flags(flags, "clap definitions in " + ", ".join(str(p.relative_to(ROOT)) for p in paths))

    def check(self, args: list[str]) -> list[str]:
        """What is wrong with `args` (flags only, `--name=value` or `--name`)."""
        problems = []
        for arg in args:
            m = re.fullmatch(r"--([a-z0-9-]+)(?:=(.*))?", arg)
            if not m:
                problems.append(f"{arg!r} is not --flag=value")
                continue
            name, value = m.group(1), m.group(2)
            if name not in self.flags:
                problems.append(f"--{name} is not a flag ({self.source})")
                continue
            accepted = self.flags[name]
            if accepted is False and value is not None:
                problems.append(f"--{name} takes no value, got {value!r}")
            elif accepted is not False and value is None:
                problems.append(f"--{name} needs a value")
            elif isinstance(accepted, list) and value not in accepted:
                problems.append(f"--{name}={value}: not one of {accepted}")
        return problems


# Spoke flags announced for the Kubernetes backend and the spoke's HTTP endpoint, written by
# other branches and maybe not merged yet; the chart passes them. Declared here so this test holds
# before and after they land: once spoke/src/cli.rs defines one, its clap definition is what
# counts. (name -> False: a switch, None: takes a value.)
ANNOUNCED_SPOKE_FLAGS: dict[str, object] = {
    "kubeconfig": None,
    "create-namespaces": False,
    "kueue-queue": None,
    "field-manager": None,
    "http-address": None,
}

HUB_SOURCES = [ROOT / "hub/src/bin/trainhub.rs", ROOT / "hub/src/hub.rs", ROOT / "hub/src/dispatch/mod.rs", ROOT / "hub/src/plugins/sources.rs", ROOT / "hub/src/dashboard/mod.rs"]
SPOKE_SOURCES = [ROOT / "spoke/src/cli.rs"]


def hub_flags() -> tuple[Flags, Flags]:
    """(global flags of `trainhub`, flags of `trainhub serve`), from the clap definitions."""
    flags = Flags.from_sources(HUB_SOURCES)
    self_check = [f for f in ("data-dir", "listen", "grpc-listen", "spoke-ca-file", "log-format") if f not in flags.flags]
    assert not self_check, f"the flag extraction found none of {self_check} in {flags.source}"
    return Flags({"log-format": flags.flags["log-format"]}, flags.source), flags


def spoke_flags() -> Flags:
    """The spoke's clap definitions, plus the announced flags it does not define yet."""
    defined = Flags.from_sources(SPOKE_SOURCES)
    assert {"hub", "ca", "cert", "key", "label", "backend"} <= defined.flags.keys(), defined.flags
    pending = {k: v for k, v in ANNOUNCED_SPOKE_FLAGS.items() if k not in defined.flags}
    source = defined.source + (f" + announced, not yet defined: {', '.join(sorted(pending))}" if pending else "")
    return Flags({**pending, **defined.flags}, source)


def pending_spoke_flags(args: list[str]) -> list[str]:
    """Announced flags in `args` that spoke/src/cli.rs does not define yet."""
    defined = Flags.from_sources(SPOKE_SOURCES).flags
    return sorted({a[2:].partition("=")[0] for a in args} & (ANNOUNCED_SPOKE_FLAGS.keys() - defined.keys()))


def dockerfile_entrypoint(path: Path) -> str:
    m = re.search(r'^ENTRYPOINT \["([^"]+)"', path.read_text(), re.M)
    assert m, f"{path}: no exec-form ENTRYPOINT"
    return Path(m.group(1)).name


def workspace_binaries() -> set[str]:
    names = set()
    for manifest in ROOT.glob("**/Cargo.toml"):
        if "target" in manifest.relative_to(ROOT).parts:
            continue
        names.update(re.findall(r'\[\[bin\]\]\s*\nname\s*=\s*"([^"]+)"', manifest.read_text()))
    return names


def leaf_paths(values: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(leaf_paths(value, path + "."))
        else:
            out.append(path)
    return out


def rules_cover(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(
        (group in r.get("apiGroups", []) or "*" in r.get("apiGroups", []))
        and (resource in r.get("resources", []) or "*" in r.get("resources", []))
        and (verb in r.get("verbs", []) or "*" in r.get("verbs", []))
        for r in rules
    )


# --- the tests ----------------------------------------------------------------------------

class ChartTest(unittest.TestCase):
    def test_lint_is_clean_for_every_values_file(self):
        for chart in CHARTS_UNDER_TEST:
            for label, values in cases(chart):
                with self.subTest(chart=chart, values=label):
                    report = helm.lint(str(CHARTS / chart), values, strict=True, kube_version="v1.30.0")
                    findings = [m for m in report["messages"] if m["severity"] >= 2]
                    self.assertEqual(report["errors"], [], report)
                    self.assertEqual(findings, [], report)

    def test_every_rendered_object_is_valid_kubernetes(self):
        skipped = set()
        for chart in CHARTS_UNDER_TEST:
            for label, values in cases(chart):
                objects = render(chart, values)
                self.assertTrue(objects, f"{chart} with {label} rendered nothing")
                for template, obj in objects:
                    key = (obj["apiVersion"], obj["kind"])
                    if key in FOREIGN_KINDS:
                        skipped.add(f"{key[1]} ({FOREIGN_KINDS[key]})")
                        continue
                    for version in KUBE_VERSIONS:
                        with self.subTest(chart=chart, values=label, template=template, kube=version):
                            validate_object(obj, version)
        print(f"\n  not schema-validated (no schema in kubernetes-validate): {', '.join(sorted(skipped))}", file=sys.stderr)

    def test_the_validator_rejects_what_an_api_server_would(self):
        (deployment,) = [o for _, o in render("trainhub", {}) if o["kind"] == "Deployment"]
        deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["sheme"] = "HTTPS"
        with self.assertRaises(ValidationFailure):
            validate_object(deployment, KUBE_VERSIONS[0])

    def test_security_context_probes_and_resources_of_every_container(self):
        for chart in CHARTS_UNDER_TEST:
            for label, values in cases(chart):
                for _, obj in render(chart, values):
                    if obj["kind"] != "Deployment":
                        continue
                    pod = obj["spec"]["template"]["spec"]
                    self.assertTrue(pod["securityContext"]["runAsNonRoot"])
                    self.assertEqual(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")
                    for c in pod.get("initContainers", []) + pod["containers"]:
                        with self.subTest(chart=chart, values=label, container=c["name"]):
                            sc = c["securityContext"]
                            self.assertIs(sc["allowPrivilegeEscalation"], False)
                            self.assertIs(sc["readOnlyRootFilesystem"], True)
                            self.assertIs(sc["runAsNonRoot"], True)
                            self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
                            self.assertIn("requests", c["resources"])
                    main = pod["containers"][0]
                    scheme = "HTTPS" if chart == "trainhub" else "HTTP"
                    self.assertEqual(main["livenessProbe"]["httpGet"]["path"], "/livez")
                    self.assertEqual(main["readinessProbe"]["httpGet"]["path"], "/readyz")
                    self.assertEqual(main["readinessProbe"]["httpGet"].get("scheme", "HTTP"), scheme)

    def test_references_between_rendered_objects_resolve(self):
        """Probe and ServiceMonitor ports name container ports; cert-manager Secrets are mounted."""
        for chart in CHARTS_UNDER_TEST:
            for label, values in cases(chart):
                objects = [o for _, o in render(chart, values)]
                by_kind = lambda k: [o for o in objects if o["kind"] == k]
                (deployment,) = by_kind("Deployment")
                pod = deployment["spec"]["template"]["spec"]
                ports = {p["name"] for p in pod["containers"][0]["ports"]}
                secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
                with self.subTest(chart=chart, values=label):
                    for probe in ("livenessProbe", "readinessProbe"):
                        self.assertIn(pod["containers"][0][probe]["httpGet"]["port"], ports)
                    service_ports = {p["name"] for s in by_kind("Service") for p in s["spec"]["ports"]}
                    for sm in by_kind("ServiceMonitor"):
                        for ep in sm["spec"]["endpoints"]:
                            self.assertIn(ep["port"], service_ports & ports)
                    issuers = {i["metadata"]["name"] for i in by_kind("Issuer")}
                    for cert in by_kind("Certificate"):
                        ref = cert["spec"]["issuerRef"]
                        if ref.get("kind", "Issuer") == "Issuer" and issuers:
                            self.assertIn(ref["name"], issuers)
                    served = [c for c in by_kind("Certificate") if "spoke-certificate" not in c["metadata"]["labels"].get("app.kubernetes.io/component", "") and not c["spec"].get("isCA")]
                    for cert in served:
                        self.assertIn(cert["spec"]["secretName"], secrets)

    def test_invalid_values_fail_naming_the_value(self):
        hub_address = {"tls": {"existingSecret": "s"}}
        wrong = [
            ("trainspoke", hub_address, "hub/address"),
            ("trainspoke", merge(hub_address, {"hub": {"address": "http://hub:6444"}}), "hub/address"),
            ("trainspoke", {"hub": {"address": "https://hub:6444"}}, "tls.existingSecret"),
            ("trainspoke", merge(CHARTS_UNDER_TEST["trainspoke"]["required"], {"backend": "slurm"}), "/backend"),
            ("trainspoke", merge(CHARTS_UNDER_TEST["trainspoke"]["required"], {"certManager": {"enabled": True}}), "certManager.spokeName"),
            ("trainhub", {"replicaCount": 2}, "/replicaCount"),
            ("trainhub", {"replicaCount": 3, "store": {"type": "redb"}}, "/replicaCount"),
            ("trainhub", {"replicaCount": 3, "store": {"type": "etcd"}}, "/store/etcd/endpoints"),
            ("trainhub", {"store": {"type": "etcd", "etcd": {"endpoints": ["https://e:2379/x"]}}}, "/store/etcd/endpoints/0"),
            ("trainhub", {"store": {"type": "postgres"}}, "/store/type"),
            ("trainhub", {"certManager": {"enabled": True, "spokes": ["GPU_East"]}}, "/certManager/spokes/0"),
            ("trainhub", {"tls": {"existingSecret": ""}}, "tls.existingSecret"),
            ("trainhub", {"dispatch": {"mode": "round-robin"}}, "/dispatch/mode"),
            ("trainhub", {"plugins": {"enabled": True}}, "plugins.volume"),
            ("trainhub", {"persistence": {"sise": "1Gi"}}, "sise"),
            ("trainhub", {"auth": {"tokens": {"existingSecret": ""}}}, "auth.tokens.existingSecret"),
        ]
        for chart, values, named in wrong:
            with self.subTest(chart=chart, values=values):
                with self.assertRaises(helm.HelmError) as raised:
                    render(chart, values)
                self.assertIn(named, str(raised.exception))

    def test_replicas_on_etcd_get_a_budget_spread_and_rolling_updates_and_redb_one_writer(self):
        def kinds(values):
            return {o["kind"]: o for _, o in render("trainhub", values)}

        ha = kinds(yaml.safe_load((CHARTS / "trainhub/ci/etcd-ha-values.yaml").read_text()))
        deployment = ha["Deployment"]["spec"]
        self.assertEqual(deployment["replicas"], 3)
        self.assertEqual(deployment["strategy"]["type"], "RollingUpdate")
        self.assertEqual(ha["PodDisruptionBudget"]["spec"]["maxUnavailable"], 1)
        spread = deployment["template"]["spec"]["affinity"]["podAntiAffinity"]
        term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(term["labelSelector"]["matchLabels"], deployment["selector"]["matchLabels"])
        self.assertNotIn("PersistentVolumeClaim", ha)
        args = deployment["template"]["spec"]["containers"][0]["args"]
        self.assertIn("--storage-backend=etcd3", args)
        self.assertIn("--etcd-certfile=/etc/trainhub/etcd/tls.crt", args)

        single = kinds({})
        self.assertEqual(single["Deployment"]["spec"]["strategy"]["type"], "Recreate")
        self.assertNotIn("PodDisruptionBudget", single)
        self.assertIn("PersistentVolumeClaim", single)
        self.assertNotIn("affinity", single["Deployment"]["spec"]["template"]["spec"])
        one_on_etcd = kinds({"store": {"type": "etcd", "etcd": {"endpoints": ["http://etcd:2379"]}}})
        self.assertNotIn("PodDisruptionBudget", one_on_etcd)

    def test_the_hub_chart_crds_are_the_generated_crds(self):
        generated = sorted(p.name for p in (ROOT / "manifests/crds").glob("*.yaml"))
        copied = sorted(p.name for p in (CHARTS / "trainhub/files/crds").glob("*.yaml"))
        self.assertEqual(copied, generated, "charts/trainhub/files/crds/ must hold manifests/crds/")
        for name in generated:
            self.assertEqual(
                (CHARTS / "trainhub/files/crds" / name).read_text(),
                (ROOT / "manifests/crds" / name).read_text(),
                f"charts/trainhub/files/crds/{name} is stale: cp manifests/crds/*.yaml charts/trainhub/files/crds/",
            )
        rendered = [o for _, o in render("trainhub", {"crds": {"install": True}}) if o["kind"] == "CustomResourceDefinition"]
        expected = [yaml.safe_load((ROOT / "manifests/crds" / n).read_text()) for n in generated]
        self.assertEqual(sorted(rendered, key=str), sorted(expected, key=str))
        self.assertFalse(any(o["kind"] == "CustomResourceDefinition" for _, o in render("trainhub", {})))

    def test_install_manifests_are_current(self):
        for chart in CHARTS_UNDER_TEST:
            with self.subTest(chart=chart):
                path = INSTALL / f"{chart.removeprefix('train')}.yaml"
                self.assertTrue(path.exists(), f"{path.relative_to(ROOT)} is missing: run `{REGENERATE}`")
                self.assertEqual(path.read_text(), install_manifest(chart), f"{path.relative_to(ROOT)} is stale: run `{REGENERATE}`")

    def test_every_value_is_documented_in_the_chart_readme(self):
        """Each value in values.yaml has a row (its own or a parent's, e.g. `resources`), and each row is a value."""
        for chart in CHARTS_UNDER_TEST:
            values = yaml.safe_load((CHARTS / chart / "values.yaml").read_text())
            readme = (CHARTS / chart / "README.md").read_text()
            documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
            leaves = leaf_paths(values)
            every_path = {".".join(leaf.split(".")[:i]) for leaf in leaves for i in range(1, leaf.count(".") + 2)}
            undocumented = [
                leaf for leaf in leaves
                if not any(".".join(leaf.split(".")[:i]) in documented for i in range(1, leaf.count(".") + 2))
            ]
            with self.subTest(chart=chart):
                self.assertEqual(undocumented, [], f"values missing from charts/{chart}/README.md")
                self.assertEqual(sorted(documented - every_path), [], f"rows of charts/{chart}/README.md that are no value")

    def test_the_spoke_cluster_role_covers_the_kube_backends_reference_rules(self):
        values = merge(CHARTS_UNDER_TEST["trainspoke"]["required"], {"kube": {"createNamespaces": True}})
        (role,) = [o for _, o in render("trainspoke", values) if o["kind"] == "ClusterRole"]
        (binding,) = [o for _, o in render("trainspoke", values) if o["kind"] == "ClusterRoleBinding"]
        self.assertEqual(binding["roleRef"]["name"], role["metadata"]["name"])
        needed = [
            ("jobset.x-k8s.io", "jobsets", "create"), ("jobset.x-k8s.io", "jobsets", "watch"),
            ("jobset.x-k8s.io", "jobsets/status", "get"), ("scheduling.x-k8s.io", "podgroups", "create"),
            ("scheduling.volcano.sh", "podgroups", "create"), ("", "configmaps", "patch"),
            ("", "secrets", "patch"), ("", "pods", "watch"), ("", "pods/log", "get"),
            ("", "nodes", "list"), ("", "events", "create"), ("", "namespaces", "create"),
        ]
        if RBAC_REFERENCE.exists():
            for doc in yaml.safe_load_all(RBAC_REFERENCE.read_text()):
                if doc and doc.get("kind") == "ClusterRole":
                    for rule in doc.get("rules", []):
                        for group in rule.get("apiGroups", []):
                            for resource in rule.get("resources", []):
                                needed += [(group, resource, verb) for verb in rule.get("verbs", [])]
        missing = [n for n in needed if not rules_cover(role["rules"], *n)]
        self.assertEqual(missing, [], f"the chart's ClusterRole lacks these (reference: {RBAC_REFERENCE.relative_to(ROOT)})")
        (plain,) = [o for _, o in render("trainspoke", CHARTS_UNDER_TEST["trainspoke"]["required"]) if o["kind"] == "ClusterRole"]
        self.assertFalse(rules_cover(plain["rules"], "", "namespaces", "create"), "namespaces/create only with kube.createNamespaces")


class BinaryFlagsTest(unittest.TestCase):
    """The Deployments run the images' entrypoints with flags those binaries accept."""

    def deployments(self, chart: str):
        for label, values in cases(chart):
            (deployment,) = [o for _, o in render(chart, values) if o["kind"] == "Deployment"]
            yield label, deployment["spec"]["template"]["spec"]["containers"][0]

    def test_hub_deployment_runs_trainhub_serve_with_accepted_flags(self):
        self.assertEqual(dockerfile_entrypoint(IMAGES["trainhub"]), "trainhub")
        global_flags, serve_flags = hub_flags()
        for label, container in self.deployments("trainhub"):
            with self.subTest(values=label):
                self.assertNotIn("command", container, "the image's ENTRYPOINT is the binary")
                args = container["args"]
                self.assertIn("serve", args)
                split = args.index("serve")
                self.assertEqual(global_flags.check(args[:split]), [])
                self.assertEqual(serve_flags.check(args[split + 1:]), [], serve_flags.source)
                for required in ("data-dir", "tls-cert-file", "tls-private-key-file", "grpc-listen", "spoke-ca-file"):
                    self.assertTrue(any(a.startswith(f"--{required}=") for a in args), required)

    def test_the_flag_check_rejects_what_the_binaries_would(self):
        global_flags, serve_flags = hub_flags()
        self.assertTrue(serve_flags.check(["--data-dir=/data", "--no-such-flag=1"]))
        self.assertTrue(serve_flags.check(["--data-dir"]), "a flag that takes a value, given none")
        self.assertEqual(global_flags.check(["--log-format=json"]), [])
        spoke = spoke_flags()
        self.assertTrue(spoke.check(["--hub=https://h:6444", "--hubs=https://h:6444"]))
        self.assertEqual(spoke.check([f"--{f}" if v is False else f"--{f}=x" for f, v in ANNOUNCED_SPOKE_FLAGS.items()]), [])

    def test_spoke_deployment_runs_trainspoke_with_accepted_flags(self):
        self.assertEqual(dockerfile_entrypoint(IMAGES["trainspoke"]), "trainspoke")
        flags = spoke_flags()
        for label, container in self.deployments("trainspoke"):
            with self.subTest(values=label):
                self.assertNotIn("command", container)
                self.assertEqual(flags.check(container["args"]), [], flags.source)
                for required in ("hub", "ca", "cert", "key", "http-address"):
                    self.assertTrue(any(a.startswith(f"--{required}=") for a in container["args"]), required)

    def test_a_process_spoke_passes_capacity_only_when_declared(self):
        process = merge(CHARTS_UNDER_TEST["trainspoke"]["required"], {"backend": "process"})

        def args(values: dict) -> list[str]:
            (deployment,) = [o for _, o in render("trainspoke", values) if o["kind"] == "Deployment"]
            return deployment["spec"]["template"]["spec"]["containers"][0]["args"]

        self.assertEqual([a for a in args(process) if a.startswith("--capacity")], [], "empty: the spoke discovers it")
        declared = args(merge(process, {"process": {"capacity": "cpu=2,memory=4Gi,amd.com/gpu=8"}}))
        self.assertIn("--capacity=cpu=2,memory=4Gi,amd.com/gpu=8", declared)
        self.assertEqual(spoke_flags().check(declared), [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, *, ca: Path | None = None, token: str | None = None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
        return 0, b""


class Pod:
    """A rendered Deployment's container run as a local process: each volume mount is a
    directory under `root` filled with `files` (mount path -> {name: content}), every mount
    path in the args points there, and `listen` maps container ports to local ones."""

    def __init__(self, binary: Path, deployment: dict, root: Path, files: dict, rewrite: dict, env: dict):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        args = list(container["args"])
        mounts = sorted((m["mountPath"] for m in container["volumeMounts"]), key=len, reverse=True)
        for mount in mounts:
            (root / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for name, content in files.get(mount, {}).items():
                (root / mount.lstrip("/") / name).write_bytes(content)
        for old, new in rewrite.items():
            args = [a.replace(old, new) for a in args]
        def local(arg: str) -> str:
            flag, eq, value = arg.partition("=")
            mount = next((m for m in mounts if value == m or value.startswith(m + "/")), None)
            return f"{flag}={root}{value}" if eq and mount else arg

        args = [local(a) for a in args]
        self.args = args
        self.log = open(root / "log", "w+b")
        pod_env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        self.process = subprocess.Popen([binary, *args], stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **pod_env, **env})

    def wait_until(self, what: str, ready, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"exited with {self.process.returncode} before {what}: {self.output()}")
            if ready():
                return
            time.sleep(0.2)
        raise AssertionError(f"not {what} after {seconds} s: {self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@unittest.skipUnless(os.environ.get("TRAINHUB_BIN"), "needs the built binaries (TRAINHUB_BIN, and TRAINSPOKE_BIN for the spoke)")
class StartTest(unittest.TestCase):
    """The rendered hub and spoke Deployments, run as local processes with their args and env:
    the hub serves and has installed the built-in runtimes, the spoke connects to it."""

    def test_the_rendered_deployments_start_and_the_spoke_joins_the_hub(self):
        trainhub = Path(os.environ["TRAINHUB_BIN"])
        trainctl = trainhub.with_name("trainctl")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            pki = tmp / "pki"
            for args in (["init"], ["hub", "--ip", "127.0.0.1"], ["spoke", "gpu-east"]):
                subprocess.run([trainctl, "certs", *args, "--dir", pki], check=True, capture_output=True)
            read = lambda name: (pki / name).read_bytes()
            token = "packaging-test-token"
            api, grpc, http = free_port(), free_port(), free_port()

            (hub_deployment,) = [o for _, o in render("trainhub", {}) if o["kind"] == "Deployment"]
            hub = Pod(
                trainhub, hub_deployment, tmp / "hub",
                {
                    "/etc/trainhub/tls": {"tls.crt": read("hub.crt"), "tls.key": read("hub.key"), "ca.crt": read("ca.crt")},
                    "/etc/trainhub/tokens": {"tokens.csv": f'{token},admin,admin,"trainhub:admins"\n'.encode()},
                },
                {"0.0.0.0:6443": f"127.0.0.1:{api}", "0.0.0.0:6444": f"127.0.0.1:{grpc}"},
                {k: v for k, v in os.environ.items() if k == "TRAINHUB_PLUGIN_CACHE_DIR"},
            )
            spoke = None
            try:
                # A cold plugin cache means compiling the built-ins first.
                hub.wait_until("ready", lambda: get(f"https://127.0.0.1:{api}/readyz", ca=pki / "ca.crt")[0] == 200, 240)
                status, body = get(
                    f"https://127.0.0.1:{api}/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes",
                    ca=pki / "ca.crt", token=token,
                )
                self.assertEqual(status, 200, body)
                names = {i["metadata"]["name"] for i in json.loads(body)["items"]}
                self.assertIn("torch-distributed", names, "trainhub serve installs the built-in runtimes")

                values = merge(CHARTS_UNDER_TEST["trainspoke"]["required"], yaml.safe_load((CHARTS / "trainspoke/ci/process-backend-values.yaml").read_text()))
                (spoke_deployment,) = [o for _, o in render("trainspoke", values) if o["kind"] == "Deployment"]
                pending = pending_spoke_flags(spoke_deployment["spec"]["template"]["spec"]["containers"][0]["args"])
                if not os.environ.get("TRAINSPOKE_BIN"):
                    self.skipTest("hub served; the spoke is not started: TRAINSPOKE_BIN is not set")
                if pending:
                    self.skipTest(f"hub served; the spoke is not started: spoke/src/cli.rs does not define --{', --'.join(pending)} yet")
                spoke = Pod(
                    Path(os.environ["TRAINSPOKE_BIN"]), spoke_deployment, tmp / "spoke",
                    {
                        "/etc/trainspoke/tls": {"tls.crt": read("gpu-east.crt"), "tls.key": read("gpu-east.key")},
                        "/etc/trainspoke/ca": {"ca.crt": read("ca.crt")},
                    },
                    {values["hub"]["address"]: f"https://127.0.0.1:{grpc}", "0.0.0.0:8080": f"127.0.0.1:{http}"},
                    {},
                )
                spoke.wait_until("connected to the hub (/readyz)", lambda: get(f"http://127.0.0.1:{http}/readyz")[0] == 200, 60)
                status, metrics = get(f"http://127.0.0.1:{http}/metrics")
                self.assertEqual(status, 200)
            finally:
                if spoke:
                    spoke.stop()
                hub.stop()


class DockerfileTest(unittest.TestCase):
    """No Docker engine here: the structure of each Dockerfile, not a build."""

    def test_each_dockerfile_is_multi_stage_non_root_and_builds_a_workspace_binary(self):
        binaries = workspace_binaries()
        for image, path in IMAGES.items():
            with self.subTest(dockerfile=str(path.relative_to(ROOT))):
                text = path.read_text()
                stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
                self.assertGreaterEqual(len(stages), 2, "multi-stage")
                self.assertTrue(stages[0][0].startswith("rust:1.95"), stages[0])
                self.assertIn("distroless", stages[-1][0])
                names = {alias for _, alias in stages if alias}
                for source in re.findall(r"^COPY --from=(\S+)", text, re.M):
                    self.assertIn(source, names, f"COPY --from={source}: no such stage")
                for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
                    *sources, _dest = line.split()
                    for source in sources:
                        self.assertTrue((ROOT / source).exists(), f"COPY {source}: not in the repository")
                users = re.findall(r"^USER\s+(\S+)", text, re.M)
                self.assertTrue(users, "USER")
                uid = users[-1].split(":")[0]
                self.assertTrue(uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: a numeric non-root uid")
                entry = dockerfile_entrypoint(path)
                self.assertEqual(entry, image)
                self.assertIn(entry, binaries)
                self.assertRegex(text, rf"cargo build --release --locked -p \S+ (--bin \S+ )*--bin {entry}\b")
                if image == "trainhub":
                    self.assertIn("wasm32-wasip2", text, "hub/build.rs builds the built-in plugins for wasm32-wasip2")
        members = re.findall(r'^\s+"([^"]+)",$', (ROOT / "Cargo.toml").read_text().split("members = [")[1].split("]")[0], re.M)
        ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
        self.assertIn("target", ignored, ".dockerignore: the build context must not carry target/")
        needed = members + ["Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "wit", "manifests"]
        for path in needed:
            with self.subTest(context=path):
                self.assertFalse(
                    any(path == i or path.startswith(i.rstrip("/") + "/") for i in ignored),
                    f".dockerignore leaves out {path}, which the build needs",
                )


def update() -> None:
    INSTALL.mkdir(parents=True, exist_ok=True)
    for chart in CHARTS_UNDER_TEST:
        path = INSTALL / f"{chart.removeprefix('train')}.yaml"
        path.write_text(install_manifest(chart))
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update()
    else:
        unittest.main(verbosity=2)
