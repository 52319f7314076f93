#!/usr/bin/env python3
"""Offline checks of deploy/k8s/ and docker/ (no cluster, no Docker engine).

Every manifest parses as YAML and has the shape the README promises (a
StatefulSet of PS shards behind a headless Service, an Indexed Job of workers
with GPU requests, a ConfigMap, checkpoint volumes); the configs they carry
pass ps_server --check_config for every task, after ${VAR} expansion with the
environment the pods would have; and the counts agree between the config and
the manifests.

Usage: k8s_manifests_test.py SOURCE_DIR PS_SERVER_BINARY
"""
import os
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


def check_config(text, task, env):
    """Runs ps_server --check_config on `text` as `task`; returns (code, output).

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
            [PS_SERVER, "--config=" + path, "--task=" + task, "--check_config"],
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


if __name__ == "__main__":
    SOURCE_DIR, PS_SERVER = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
