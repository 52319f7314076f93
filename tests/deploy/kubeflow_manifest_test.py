#!/usr/bin/env python3
"""Offline checks of deploy/kubeflow/tfjob.yaml and pytorchjob.yaml (no
cluster, no operator).

The TFJob has the shape of the Training Operator's kubeflow.org/v1 schema
(the fields it uses, their types and allowed values), runs our image with
the token and TLS from Secrets and the checkpoint volume on the PS; its
config carries no cluster shape of its own, so the replica counts are the
cluster; and every replica accepts the config with the TF_CONFIG the
operator would give it (ps_server or worker --check_config, after the pods'
paths are mapped to stand-ins).

The PyTorchJob runs the script in the container the operator gives
torchrun's environment, and its shard beside the master with the same
variables, at the port the script derives (MASTER_PORT+1), with
--exit_when_done; the shard accepts them (ps_server --check_config).

Usage: kubeflow_manifest_test.py SOURCE_DIR PS_SERVER_BINARY WORKER_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import yaml

SOURCE_DIR = ""
PS_SERVER = ""
WORKER = ""

# The parts of the TFJob v1 CRD (kubeflow/training-operator,
# kubeflow.org_tfjobs.yaml) this manifest uses: allowed keys and values.
TFJOB_SPEC_KEYS = {"runPolicy", "tfReplicaSpecs", "successPolicy", "enableDynamicWorker"}
RUN_POLICY_KEYS = {"cleanPodPolicy", "backoffLimit", "activeDeadlineSeconds",
                   "ttlSecondsAfterFinished", "schedulingPolicy", "suspend"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}
REPLICA_TYPES = {"PS", "Worker", "Chief", "Master", "Evaluator"}
REPLICA_SPEC_KEYS = {"replicas", "template", "restartPolicy"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
# The operator sets TF_CONFIG in the container of this name, and builds the
# cluster's addresses from the port of this name.
CONTAINER_NAME = "tensorflow"
PORT_NAME = "tfjob-port"


def load_documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def operator_tf_config(job_name, namespace, replicas, port, task_type, index):
    """TF_CONFIG as the Training Operator writes it for one replica."""
    cluster = {}
    for rtype, count in replicas.items():
        cluster[rtype.lower()] = ["%s-%s-%d.%s.svc:%d" % (job_name, rtype.lower(), i, namespace, port)
                                  for i in range(count)]
    return json.dumps({"cluster": cluster, "task": {"type": task_type.lower(), "index": index},
                       "environment": "cloud"})


def check_config(binary, text, tf_config, extra_args=()):
    """Runs `binary` --check_config on `text` with TF_CONFIG; returns (code, output).

    The pods' paths are mapped into a scratch directory holding stand-ins
    (the TLS files, the checkpoint directory's parent) and the token
    variable is set, as the Secrets would.
    """
    with tempfile.TemporaryDirectory() as pod:
        for name in ("tls.crt", "tls.key", "ca.crt"):
            with open(os.path.join(pod, name), "w") as f:
                f.write("stand-in PEM\n")
        text = text.replace("/etc/pstrain/tls/", pod + "/").replace("/var/lib/pstrain/", pod + "/")
        path = os.path.join(pod, "job.textproto")
        with open(path, "w") as f:
            f.write(text)
        env = dict(os.environ, PSTRAIN_TOKEN="stand-in-token", TF_CONFIG=tf_config)
        run = subprocess.run([binary, "--config=" + path, "--check_config", *extra_args],
                             env=env, capture_output=True, text=True, timeout=30)
        return run.returncode, run.stdout + run.stderr


class TfJobManifestTest(unittest.TestCase):
    def setUp(self):
        docs = load_documents(os.path.join(SOURCE_DIR, "deploy", "kubeflow", "tfjob.yaml"))
        self.objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        self.tfjob = self.objects[("TFJob", "pstrain")]
        self.specs = self.tfjob["spec"]["tfReplicaSpecs"]
        self.config = self.objects[("ConfigMap", "pstrain-tfjob-config")]["data"]["job.textproto"]
        self.replicas = {rtype: spec["replicas"] for rtype, spec in self.specs.items()}

    def container(self, rtype):
        return self.specs[rtype]["template"]["spec"]["containers"][0]

    def port(self, rtype):
        return [p for p in self.container(rtype)["ports"] if p["name"] == PORT_NAME][0]["containerPort"]

    def test_has_the_shape_of_a_tfjob(self):
        self.assertEqual(self.tfjob["apiVersion"], "kubeflow.org/v1")
        spec = self.tfjob["spec"]
        self.assertLessEqual(set(spec), TFJOB_SPEC_KEYS)
        self.assertLessEqual(set(spec["runPolicy"]), RUN_POLICY_KEYS)
        self.assertIn(spec["runPolicy"]["cleanPodPolicy"], CLEAN_POD_POLICIES)
        self.assertIsInstance(spec["runPolicy"]["backoffLimit"], int)
        self.assertEqual(set(self.specs), {"PS", "Worker"})
        self.assertLessEqual(set(self.specs), REPLICA_TYPES)
        for rtype, replica in self.specs.items():
            with self.subTest(rtype):
                self.assertLessEqual(set(replica), REPLICA_SPEC_KEYS)
                self.assertIsInstance(replica["replicas"], int)
                self.assertGreaterEqual(replica["replicas"], 1)
                self.assertIn(replica["restartPolicy"], RESTART_POLICIES)
                containers = replica["template"]["spec"]["containers"]
                self.assertEqual(containers[0]["name"], CONTAINER_NAME)
                self.assertTrue(containers[0]["image"])

    def test_runs_our_binaries_with_no_task_of_their_own(self):
        ps = self.container("PS")["command"]
        self.assertEqual(ps[0], "ps_server")
        self.assertIn("--listen=0.0.0.0:%d" % self.port("PS"), ps)
        self.assertEqual(self.container("Worker")["command"][0], "worker")
        for rtype in self.specs:
            command = " ".join(self.container(rtype)["command"])
            self.assertNotIn("--task", command)  # TF_CONFIG's task
            self.assertIn("--config=/etc/pstrain/job.textproto", command)

    def test_the_cluster_shape_is_the_replica_counts_alone(self):
        for line in self.config.splitlines():
            field = line.split("#")[0].strip()
            self.assertFalse(field.startswith("ps:") or field.startswith("workers:"), line)

    def test_secrets_and_the_checkpoint_volume(self):
        for rtype in self.specs:
            with self.subTest(rtype):
                container = self.container(rtype)
                token = [e for e in container["env"] if e["name"] == "PSTRAIN_TOKEN"][0]
                self.assertEqual(token["valueFrom"]["secretKeyRef"]["name"], "pstrain-token")
                volumes = {v["name"]: v for v in self.specs[rtype]["template"]["spec"]["volumes"]}
                self.assertEqual(volumes["tls"]["secret"]["secretName"], "pstrain-tls")
                mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
                self.assertEqual(mounts["tls"], "/etc/pstrain/tls")
        volumes = {v["name"]: v for v in self.specs["PS"]["template"]["spec"]["volumes"]}
        claim = volumes["checkpoints"]["persistentVolumeClaim"]["claimName"]
        self.assertIn(("PersistentVolumeClaim", claim), self.objects)
        mounts = {m["name"]: m["mountPath"] for m in self.container("PS")["volumeMounts"]}
        self.assertIn('dir: "%s"' % mounts["checkpoints"], self.config)

    def test_every_replica_accepts_the_config_with_its_tf_config(self):
        expected = "config OK: %d ps shard(s), %d worker(s), sync mode, mutual TLS + token" % (
            self.replicas["PS"], self.replicas["Worker"])
        for rtype, binary in (("PS", PS_SERVER), ("Worker", WORKER)):
            for index in range(self.replicas[rtype]):
                with self.subTest(task="%s:%d" % (rtype, index)):
                    tf_config = operator_tf_config("pstrain", "training", self.replicas,
                                                   self.port(rtype), rtype, index)
                    code, output = check_config(binary, self.config, tf_config)
                    self.assertEqual(code, 0, output)
                    self.assertIn(expected, output)

    def test_a_replica_outside_the_cluster_or_a_conflicting_task_is_refused(self):
        # sanity: the check judges the TF_CONFIG it is given
        tf_config = operator_tf_config("pstrain", "training", self.replicas, 2222, "PS",
                                       self.replicas["PS"])
        code, output = check_config(PS_SERVER, self.config, tf_config)
        self.assertEqual(code, 2, output)
        self.assertIn("TF_CONFIG has task ps:%d" % self.replicas["PS"], output)
        tf_config = operator_tf_config("pstrain", "training", self.replicas, 2222, "PS", 0)
        code, output = check_config(PS_SERVER, self.config, tf_config, ["--task=ps:1"])
        self.assertEqual(code, 2, output)
        self.assertIn("--task=ps:1 but TF_CONFIG's task is ps:0", output)


class PyTorchJobManifestTest(unittest.TestCase):
    def setUp(self):
        docs = load_documents(os.path.join(SOURCE_DIR, "deploy", "kubeflow", "pytorchjob.yaml"))
        self.job = [d for d in docs if d["kind"] == "PyTorchJob"][0]
        self.specs = self.job["spec"]["pytorchReplicaSpecs"]

    def containers(self, rtype):
        return {c["name"]: c for c in self.specs[rtype]["template"]["spec"]["containers"]}

    def test_has_the_shape_of_a_pytorchjob(self):
        self.assertEqual(self.job["apiVersion"], "kubeflow.org/v1")
        self.assertLessEqual(set(self.job["spec"]), {"runPolicy", "pytorchReplicaSpecs",
                                                     "elasticPolicy", "nprocPerNode"})
        self.assertLessEqual(set(self.job["spec"]["runPolicy"]), RUN_POLICY_KEYS)
        self.assertEqual(set(self.specs), {"Master", "Worker"})
        self.assertEqual(self.specs["Master"]["replicas"], 1)
        for rtype, replica in self.specs.items():
            with self.subTest(rtype):
                self.assertLessEqual(set(replica), REPLICA_SPEC_KEYS)
                self.assertIn(replica["restartPolicy"], RESTART_POLICIES)
                self.assertIn("pytorch", self.containers(rtype))

    def test_the_shard_sits_where_the_script_looks_for_it(self):
        job = self.job["metadata"]["name"]
        master = self.containers("Master")
        port = [p for p in master["pytorch"]["ports"]
                if p["name"] == "pytorchjob-port"][0]["containerPort"]
        ps = master["ps"]
        env = {e["name"]: e["value"] for e in ps["env"]}
        workers = self.specs["Master"]["replicas"] + self.specs["Worker"]["replicas"]
        self.assertEqual(env, {"WORLD_SIZE": str(workers), "MASTER_ADDR": f"{job}-master-0",
                               "MASTER_PORT": str(port)})
        command = ps["command"]
        self.assertEqual(command[0], "ps_server")
        self.assertIn(f"--listen=0.0.0.0:{port + 1}", command)
        self.assertIn("--exit_when_done", command)
        self.assertNotIn("--config", " ".join(command))  # the script's model, the env's cluster
        self.assertEqual(ps["readinessProbe"]["tcpSocket"]["port"], port + 1)
        run = subprocess.run([PS_SERVER, *command[1:], "--check_config"],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn(f"config OK: 1 ps shard(s), {workers} worker(s)", run.stdout + run.stderr)


if __name__ == "__main__":
    SOURCE_DIR, PS_SERVER, WORKER = sys.argv[1], sys.argv[2], sys.argv[3]
    unittest.main(argv=sys.argv[:1], verbosity=2)
