#!/usr/bin/env python3
"""Offline checks of deploy/k8s/, deploy/k8s-replicated/ and docker/ (no
cluster, no Docker engine).

Every manifest parses as YAML and has the shape the README promises (a
StatefulSet of PS shards behind a headless Service, an Indexed Job of workers
with GPU requests, a ConfigMap, checkpoint volumes); the configs they carry
pass ps_server --check_config for every task, after ${VAR} expansion with the
environment the pods would have; and the counts agree between the config and
the manifests.

The replicated overlay (deploy/k8s-replicated, built here as `kubectl
kustomize` would, and compared with it where kubectl is installed) keeps the
base, and adds one backup per shard at the DNS name its config names, etcd
at the endpoint its config names, and NetworkPolicies that let workers and
primaries reach the backups, backups the primaries, and only the PS pods
etcd. The replicated compose files (docker/docker-compose.replicated.yml
over docker-compose.yml) agree with their config the same way.

Usage: k8s_manifests_test.py SOURCE_DIR PS_SERVER_BINARY
"""
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

SOURCE_DIR = ""
PS_SERVER = ""


def load_documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def k8s_objects():
    k8s_dir = os.path.join(SOURCE_DIR, "deploy", "k8s")
    kustomization = load_documents(os.path.join(k8s_dir, "kustomization.yaml"))[0]
    objects = {}
    for name in kustomization["resources"]:
        for doc in load_documents(os.path.join(k8s_dir, name)):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def merge_patch(target, patch):
    """A strategic merge patch as kustomize applies it to maps: maps merge key
    by key, anything else (lists included) is replaced. The overlay patches
    nothing whose lists kustomize would merge by key."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def kustomize(directory):
    """The objects `kubectl kustomize DIRECTORY` makes, keyed by (kind, name),
    for the features our kustomizations use: resources (files, and
    directories with a kustomization of their own) and patches given by path
    (strategic merge). Anything else fails, so that the checks below never
    judge a build they do not make."""
    kustomization = load_documents(os.path.join(directory, "kustomization.yaml"))[0]
    unsupported = set(kustomization) - {"apiVersion", "kind", "resources", "patches"}
    if unsupported:
        raise AssertionError("%s/kustomization.yaml uses %s, which this test's build does not apply"
                             % (directory, sorted(unsupported)))
    objects = {}
    for name in kustomization.get("resources", []):
        path = os.path.normpath(os.path.join(directory, name))
        if os.path.isdir(path):
            built = kustomize(path)
        else:
            built = {(d["kind"], d["metadata"]["name"]): d for d in load_documents(path)}
        for key, doc in built.items():
            if key in objects:
                raise AssertionError("%s %s is defined twice under %s" % (key[0], key[1], directory))
            objects[key] = doc
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise AssertionError("%s: only patches given by path are applied here: %s" % (directory, patch))
        for doc in load_documents(os.path.join(directory, patch["path"])):
            key = (doc["kind"], doc["metadata"]["name"])
            if key not in objects:
                raise AssertionError("%s patches %s %s, which no resource defines" % (directory, key[0], key[1]))
            merge_patch(objects[key], doc)
    return objects


def textproto_strings(text, field):
    """Every quoted value of `field` in a text-format config, in order."""
    return re.findall(r'\b%s:\s*"([^"]*)"' % re.escape(field), text)


def without_comments(text):
    lines = [line.split("#")[0].rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line.strip())


def config_blocks(text, name):
    """The (start, end) spans of every `name { ... }` block of a text-format
    config, with the whitespace before it; `${VAR}` inside counts as no brace."""
    spans = []
    for match in re.finditer(r"\s*\b%s\s*\{" % re.escape(name), text):
        depth, i = 1, match.end()
        while depth > 0:
            if text.startswith("${", i):
                i = text.index("}", i) + 1
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        spans.append((match.start(), i))
    return spans


def without_block(text, name, containing=""):
    """`text` less every `name { ... }` block (that holds `containing`)."""
    for start, end in reversed(config_blocks(text, name)):
        if containing in text[start:end]:
            text = text[:start] + text[end:]
    return text


def labels_match(selector, labels):
    if "matchExpressions" in selector:
        raise AssertionError("matchExpressions are not judged here: %s" % selector)
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_admits(peer, labels):
    """Whether a NetworkPolicy peer may admit a pod labelled `labels` of the
    policy's namespace. Where that depends on what this test cannot see
    (the namespace's labels, pods' addresses), it says yes, so that a check
    that nobody else is admitted never passes by accident."""
    if "podSelector" in peer and not labels_match(peer["podSelector"], labels):
        return False
    return True


def admitted(policies, source_labels, target_labels, port):
    """Whether the NetworkPolicies admit a pod labelled `source_labels` (in the
    same namespace) to TCP `port` of a pod labelled `target_labels`. A pod no
    Ingress policy selects admits everyone; one that is selected admits what
    any of them allows (a rule without ports admits every port, one without
    peers every source)."""
    selecting = [p for p in policies
                 if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and labels_match(p["spec"]["podSelector"], target_labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get("from", [])
            if not peers or any(peer_admits(peer, source_labels) for peer in peers):
                return True
    return False


def check_config(text, task, env, extra_args=()):
    """Runs ps_server --check_config on `text` as `task` (and `extra_args`,
    such as --replica=1); returns (code, output).

    --check_config also checks the files the PS would use, which only exist
    in the pods: the pods' paths are mapped into a scratch directory holding
    stand-ins (the TLS files, the checkpoint directory's parent) and the
    token variable is set.
    """
    with tempfile.TemporaryDirectory() as pod:
        for name in ("tls.crt", "tls.key", "ca.crt"):
            with open(os.path.join(pod, name), "w") as f:
                f.write("stand-in PEM\n")
        text = text.replace("/etc/pstrain/tls/", pod + "/").replace("/var/lib/pstrain/", pod + "/")
        path = os.path.join(pod, "cluster.textproto")
        with open(path, "w") as f:
            f.write(text)
        run = subprocess.run(
            [PS_SERVER, "--config=" + path, "--task=" + task, "--check_config"] + list(extra_args),
            env=dict(env, PSTRAIN_TOKEN="stand-in-token"), capture_output=True, text=True,
            timeout=30)
        return run.returncode, run.stdout + run.stderr


def count_field(text, field):
    return sum(1 for line in text.splitlines() if line.strip().startswith(field + ":"))


class KubernetesManifestsTest(unittest.TestCase):
    def setUp(self):
        self.objects = k8s_objects()
        self.statefulset = self.objects[("StatefulSet", "pstrain-ps")]
        self.service = self.objects[("Service", "pstrain-ps")]
        self.job = self.objects[("Job", "pstrain-worker")]
        self.config = self.objects[("ConfigMap", "pstrain-config")]["data"]["cluster.textproto"]

    def test_ps_shards_are_a_statefulset_behind_a_headless_service(self):
        self.assertEqual(self.service["spec"]["clusterIP"], "None")
        self.assertEqual(self.statefulset["spec"]["serviceName"], "pstrain-ps")
        self.assertEqual(self.service["spec"]["selector"],
                         self.statefulset["spec"]["template"]["metadata"]["labels"])
        claims = [t["metadata"]["name"] for t in self.statefulset["spec"]["volumeClaimTemplates"]]
        self.assertIn("checkpoints", claims)

    def test_each_shard_is_reached_only_through_its_relay(self):
        containers = {c["name"]: c for c in self.statefulset["spec"]["template"]["spec"]["containers"]}
        ps, relay = containers["ps"], containers["relay"]
        self.assertIn("--listen=127.0.0.1:50052", " ".join(ps["args"]))
        self.assertNotIn("ports", ps)
        self.assertEqual(relay["command"], ["nghttpx"])
        args = relay["args"]
        self.assertIn("--frontend=0.0.0.0,50051", args)
        self.assertIn("--backend=127.0.0.1,50052;;proto=h2;tls;sni=pstrain-ps", args)
        self.assertIn("--verify-client", args)
        self.assertEqual(relay["ports"][0]["containerPort"], self.service["spec"]["ports"][0]["targetPort"])
        # The conf the relay names is the repository's, copied into the image there.
        conf = [a for a in args if a.startswith("--conf=")][0][len("--conf="):]
        with open(os.path.join(SOURCE_DIR, "docker", "Dockerfile")) as f:
            self.assertIn("COPY deploy/relay/nghttpx.conf " + conf, f.read())
        self.assertIn("server_name: \"pstrain-ps\"", self.config)

    def test_only_workers_reach_the_shards(self):
        policy = self.objects[("NetworkPolicy", "pstrain-ps")]["spec"]
        self.assertEqual(policy["podSelector"]["matchLabels"],
                         self.statefulset["spec"]["template"]["metadata"]["labels"])
        (rule,) = policy["ingress"]
        self.assertEqual([p["port"] for p in rule["ports"]], [self.service["spec"]["ports"][0]["targetPort"]])
        self.assertEqual([f["podSelector"]["matchLabels"] for f in rule["from"]],
                         [self.job["spec"]["template"]["metadata"]["labels"]])

    def test_workers_are_an_indexed_job_with_gpus(self):
        spec = self.job["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        container = spec["template"]["spec"]["containers"][0]
        self.assertIn("--task=worker:${JOB_COMPLETION_INDEX}", " ".join(container["args"]))
        self.assertGreaterEqual(int(container["resources"]["limits"]["nvidia.com/gpu"]), 1)

    def test_counts_agree_between_config_and_manifests(self):
        self.assertEqual(count_field(self.config, "ps"), self.statefulset["spec"]["replicas"])
        workers = int(self.config.split("workers:")[1].split()[0])
        self.assertEqual(workers, self.job["spec"]["completions"])
        self.assertEqual(workers, self.job["spec"]["parallelism"])

    def test_every_task_accepts_the_config(self):
        env = dict(os.environ, POD_NAMESPACE="training")
        for shard in range(self.statefulset["spec"]["replicas"]):
            code, output = check_config(self.config, "ps:%d" % shard, env)
            self.assertEqual(code, 0, output)
            self.assertIn("config OK: 2 ps shard(s), 4 worker(s), sync mode, mutual TLS + token", output)
        code, output = check_config(self.config, "ps:%d" % self.statefulset["spec"]["replicas"], env)
        self.assertEqual(code, 2, output)

    def test_config_names_shards_by_their_pod_dns_names(self):
        env = dict(os.environ, POD_NAMESPACE="training")
        code, output = check_config(self.config.replace("workers: 4", "workers: 0"), "ps:0", env)
        self.assertEqual(code, 2)  # sanity: the check does judge the text it is given
        self.assertIn("cluster.workers must be at least 1", output)
        self.assertIn("pstrain-ps-0.pstrain-ps.${POD_NAMESPACE:-default}.svc.cluster.local:50051",
                      self.config)

    def test_pods_take_the_token_from_a_secret_not_the_command_line(self):
        for workload in (self.statefulset, self.job):
            container = workload["spec"]["template"]["spec"]["containers"][0]
            token = [e for e in container["env"] if e["name"] == "PSTRAIN_TOKEN"][0]
            self.assertIn("secretKeyRef", token["valueFrom"])
            self.assertNotIn("token", " ".join(container["args"]).lower())


def pod_labels(workload):
    return workload["spec"]["template"]["metadata"]["labels"]


def containers(workload):
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


class ReplicatedKubernetesTest(unittest.TestCase):
    """deploy/k8s-replicated: the base with a backup per shard and etcd."""

    def setUp(self):
        self.base = k8s_objects()
        self.objects = kustomize(os.path.join(SOURCE_DIR, "deploy", "k8s-replicated"))
        self.primaries = self.objects[("StatefulSet", "pstrain-ps")]
        self.backups = self.objects[("StatefulSet", "pstrain-ps-backup")]
        self.backup_service = self.objects[("Service", "pstrain-ps-backup")]
        self.etcd = self.objects[("StatefulSet", "pstrain-etcd")]
        self.etcd_service = self.objects[("Service", "pstrain-etcd")]
        self.job = self.objects[("Job", "pstrain-worker")]
        self.config = self.objects[("ConfigMap", "pstrain-config")]["data"]["cluster.textproto"]

    def test_the_build_is_kubectl_kustomizes(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("no kubectl here: the overlay is built by this test alone")
        run = subprocess.run([kubectl, "kustomize", os.path.join(SOURCE_DIR, "deploy", "k8s-replicated")],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        built = {(d["kind"], d["metadata"]["name"]): d
                 for d in yaml.safe_load_all(run.stdout) if d is not None}
        self.assertEqual(built, self.objects)

    def test_the_base_is_kept(self):
        for key, doc in self.base.items():
            if key == ("ConfigMap", "pstrain-config"):
                continue
            self.assertEqual(self.objects[key], doc, "%s %s differs from the base's" % key)
        # The config is the base's, plus the backups and their membership.
        base_config = self.base[("ConfigMap", "pstrain-config")]["data"]["cluster.textproto"]
        stripped = without_comments(self.config)
        self.assertIn("ps_backups", stripped)
        self.assertIn("membership", stripped)
        stripped = without_block(without_block(stripped, "ps_backups"), "membership")
        self.assertEqual(stripped, without_comments(base_config))

    def test_each_shard_has_one_backup_at_its_pod_dns_name(self):
        shards = self.primaries["spec"]["replicas"]
        self.assertEqual(self.backups["spec"]["replicas"], shards)
        self.assertEqual(self.config.count("ps_backups {"), shards)
        self.assertEqual(self.backup_service["spec"]["clusterIP"], "None")
        self.assertTrue(self.backup_service["spec"]["publishNotReadyAddresses"])
        self.assertEqual(self.backups["spec"]["serviceName"], self.backup_service["metadata"]["name"])
        self.assertEqual(self.backup_service["spec"]["selector"], pod_labels(self.backups))
        # Backups are not the primaries' pods: neither Service nor policy mixes them.
        self.assertNotEqual(pod_labels(self.backups), pod_labels(self.primaries))
        self.assertFalse(labels_match({"matchLabels": self.objects[("Service", "pstrain-ps")]["spec"]["selector"]},
                                      pod_labels(self.backups)))
        (port,) = self.backup_service["spec"]["ports"]
        expected = ["%s-%d.%s.${POD_NAMESPACE:-default}.svc.cluster.local:%d"
                    % (self.backups["metadata"]["name"], i, self.backup_service["metadata"]["name"], port["port"])
                    for i in range(shards)]
        self.assertEqual(textproto_strings(self.config, "address"), expected)
        self.assertEqual(containers(self.backups)["relay"]["ports"][0]["containerPort"], port["targetPort"])

    def test_backups_run_replica_1_of_their_shard_behind_the_same_relay(self):
        base_pod = self.base[("StatefulSet", "pstrain-ps")]["spec"]["template"]["spec"]
        pod = self.backups["spec"]["template"]["spec"]
        ps, relay = containers(self.backups)["ps"], containers(self.backups)["relay"]
        base_ps = containers(self.base[("StatefulSet", "pstrain-ps")])["ps"]
        self.assertIn("--task=ps:${HOSTNAME##*-} --replica=1 --listen=127.0.0.1:50052", " ".join(ps["args"]))
        self.assertNotIn("ports", ps)
        self.assertEqual(relay, containers(self.base[("StatefulSet", "pstrain-ps")])["relay"])
        for key in ("image", "command", "env", "volumeMounts", "resources"):
            self.assertEqual(ps[key], base_ps[key], key)
        self.assertEqual(pod["volumes"], base_pod["volumes"])
        claims = [t["metadata"]["name"] for t in self.backups["spec"]["volumeClaimTemplates"]]
        self.assertIn("checkpoints", claims)

    def test_etcd_is_where_the_config_says(self):
        (port,) = self.etcd_service["spec"]["ports"]
        host = "%s.${POD_NAMESPACE:-default}.svc.cluster.local" % self.etcd_service["metadata"]["name"]
        self.assertEqual(textproto_strings(self.config, "etcd_endpoints"), ["%s:%d" % (host, port["port"])])
        self.assertEqual(self.etcd_service["spec"]["selector"], pod_labels(self.etcd))
        self.assertEqual(self.etcd["spec"]["replicas"], 1)
        (etcd,) = self.etcd["spec"]["template"]["spec"]["containers"]
        self.assertEqual(etcd["command"], ["pstrain-entrypoint", "etcd"])
        self.assertEqual(etcd["ports"][0]["containerPort"], port["targetPort"])
        # The entrypoint's etcd listens for clients on that port, and
        # advertises the Service's name.
        with open(os.path.join(SOURCE_DIR, "docker", "entrypoint.sh")) as f:
            entrypoint = f.read()
        self.assertIn("--listen-client-urls=http://0.0.0.0:%d" % port["targetPort"], entrypoint)
        self.assertIn("--data-dir=/var/lib/etcd/data", entrypoint)
        env = {e["name"]: e.get("value") for e in etcd["env"]}
        self.assertEqual(env["ADVERTISE_HOST"], host.replace("${POD_NAMESPACE:-default}", "$(POD_NAMESPACE)"))
        self.assertFalse([name for name in env if name.startswith("ETCD_")],
                         "etcd reads ETCD_* variables as its flags")
        # Its data on a volume of its own, kept across restarts.
        (mount,) = etcd["volumeMounts"]
        self.assertEqual(mount["mountPath"], "/var/lib/etcd")
        claims = [t["metadata"]["name"] for t in self.etcd["spec"]["volumeClaimTemplates"]]
        self.assertIn(mount["name"], claims)
        self.assertRegex(self.config, r"lease_seconds:\s*[12]\b")

    def test_network_policies_admit_replication_and_membership_only(self):
        policies = [doc for (kind, _), doc in self.objects.items() if kind == "NetworkPolicy"]
        worker, ps = pod_labels(self.job), pod_labels(self.primaries)
        backup, etcd = pod_labels(self.backups), pod_labels(self.etcd)
        stranger = {"app.kubernetes.io/name": "something-else"}
        grpc = self.backup_service["spec"]["ports"][0]["targetPort"]
        client = self.etcd_service["spec"]["ports"][0]["targetPort"]
        for source, target, port in ((worker, ps, grpc), (worker, backup, grpc), (ps, backup, grpc),
                                     (backup, ps, grpc), (ps, etcd, client), (backup, etcd, client)):
            self.assertTrue(admitted(policies, source, target, port), (source, target, port))
        for source, target, port in ((stranger, ps, grpc), (stranger, backup, grpc), (stranger, etcd, client),
                                     (worker, etcd, client), (ps, backup, client)):
            self.assertFalse(admitted(policies, source, target, port), (source, target, port))

    def test_every_replica_accepts_the_config(self):
        env = dict(os.environ, POD_NAMESPACE="training")
        for shard in range(self.primaries["spec"]["replicas"]):
            for replica in (0, 1):
                code, output = check_config(self.config, "ps:%d" % shard, env, ["--replica=%d" % replica])
                self.assertEqual(code, 0, output)
                self.assertIn("config OK: 2 ps shard(s), 4 worker(s), sync mode, mutual TLS + token", output)
        # Sanity: the check judges the backups: one shard without one is refused.
        one_short = without_block(self.config, "ps_backups", "pstrain-ps-backup-1")
        self.assertEqual(one_short.count("ps_backups {"), 1)
        code, output = check_config(one_short, "ps:0", env)
        self.assertEqual(code, 2, output)
        self.assertIn("cluster.ps_backups", output)


class ComposeFilesTest(unittest.TestCase):
    def test_compose_file_has_the_promised_services(self):
        compose = load_documents(os.path.join(SOURCE_DIR, "docker", "docker-compose.yml"))[0]
        ps, worker = compose["services"]["ps"], compose["services"]["worker"]
        self.assertTrue(ps["init"] and worker["init"])
        self.assertEqual(ps["restart"], "on-failure")
        self.assertIn("healthcheck", ps)
        self.assertIn("checkpoints", compose["volumes"])
        self.assertEqual(worker["depends_on"]["ps"]["condition"], "service_healthy")

    def test_compose_config_is_valid_with_the_compose_environment(self):
        with open(os.path.join(SOURCE_DIR, "docker", "compose.textproto")) as f:
            text = f.read()
        env = {k: v for k, v in os.environ.items()
               if k not in ("PS_ADDRESS", "WORKERS", "EPOCHS", "TRAIN_LIMIT")}
        code, output = check_config(text, "ps:0", env)
        self.assertEqual(code, 0, output)
        self.assertIn("config OK: 1 ps shard(s), 2 worker(s), sync mode, plaintext", output)
        code, output = check_config(text, "ps:0", dict(env, WORKERS="5"))
        self.assertIn("5 worker(s)", output)

    def test_replicated_compose_adds_etcd_and_a_backup(self):
        base = load_documents(os.path.join(SOURCE_DIR, "docker", "docker-compose.yml"))[0]
        override = load_documents(os.path.join(SOURCE_DIR, "docker", "docker-compose.replicated.yml"))[0]
        services = override["services"]
        self.assertEqual(set(services), {"etcd", "ps", "ps-backup", "worker"})
        etcd, ps, backup = services["etcd"], services["ps"], services["ps-backup"]
        self.assertEqual(etcd["command"], ["pstrain-entrypoint", "etcd"])
        self.assertEqual(etcd["environment"]["ADVERTISE_HOST"], "etcd")
        self.assertIn("membership:/var/lib/etcd", etcd["volumes"])
        self.assertIn("membership", override["volumes"])
        self.assertEqual(backup["command"], ["pstrain-entrypoint", "ps-backup"])
        self.assertEqual((backup["environment"]["SHARD"], backup["environment"]["REPLICA"]), ("0", "1"))
        self.assertEqual(backup["image"], base["services"]["ps"]["image"])
        self.assertTrue(backup["init"] and etcd["init"])
        for service in (ps, backup):
            self.assertEqual(service["depends_on"]["etcd"]["condition"], "service_started")
        # Workers still wait for the primary's health check (the base's), and
        # every task but etcd reads the replicated config.
        self.assertNotIn("depends_on", services["worker"])
        self.assertEqual(base["services"]["worker"]["depends_on"]["ps"]["condition"], "service_healthy")
        config = "${CONFIG:-/etc/pstrain/compose-replicated.textproto}"
        for name in ("ps", "ps-backup", "worker"):
            self.assertEqual(services[name]["environment"]["CONFIG"], config, name)
        with open(os.path.join(SOURCE_DIR, "docker", "Dockerfile")) as f:
            self.assertIn("docker/compose-replicated.textproto /etc/pstrain/", f.read())

    def test_replicated_compose_config_names_the_services(self):
        with open(os.path.join(SOURCE_DIR, "docker", "compose-replicated.textproto")) as f:
            text = f.read()
        override = load_documents(os.path.join(SOURCE_DIR, "docker", "docker-compose.replicated.yml"))[0]
        # Each replica listens where the others dial it, the address it names
        # in etcd: the primary on PS_LISTEN, the backup on its config address.
        self.assertEqual(textproto_strings(text, "ps"), ["${PS_ADDRESS:-ps:50051}"])
        self.assertEqual(override["services"]["ps"]["environment"]["PS_LISTEN"], "ps:50051")
        self.assertEqual(textproto_strings(text, "address"), ["${BACKUP_ADDRESS:-ps-backup:50051}"])
        self.assertNotIn("PS_LISTEN", override["services"]["ps-backup"]["environment"])
        self.assertEqual(textproto_strings(text, "etcd_endpoints"), ["${ETCD_ENDPOINT:-etcd:2379}"])
        with open(os.path.join(SOURCE_DIR, "docker", "entrypoint.sh")) as f:
            self.assertIn("--listen-client-urls=http://0.0.0.0:2379", f.read())
        self.assertRegex(text, r"lease_seconds:\s*[12]\b")
        # The job is the unreplicated cluster's.
        with open(os.path.join(SOURCE_DIR, "docker", "compose.textproto")) as f:
            plain = f.read()
        self.assertEqual(without_comments(text).split("training {")[1], without_comments(plain).split("training {")[1])
        env = {k: v for k, v in os.environ.items()
               if k not in ("PS_ADDRESS", "BACKUP_ADDRESS", "ETCD_ENDPOINT", "WORKERS", "EPOCHS", "TRAIN_LIMIT")}
        for replica in (0, 1):
            code, output = check_config(text, "ps:0", env, ["--replica=%d" % replica])
            self.assertEqual(code, 0, output)
            self.assertIn("config OK: 1 ps shard(s), 2 worker(s), sync mode, plaintext", output)


if __name__ == "__main__":
    SOURCE_DIR, PS_SERVER = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
