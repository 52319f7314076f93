#!/usr/bin/env python3
"""The layers' libraries include only from the layers below them.

Each folder below is one library (its CMakeLists.txt). A C++ file of it may
include the repository's headers only from the folders LAYERS allows it,
and those of NO_GRPC no gRPC header at all: so the PS core and the shared
memory regions stay testable without a network, and the worker depends on
the consistency rules without reaching into ps_server/.

Usage: layers_test.py [REPO_ROOT]   (default: this file's repository)
"""
import os
import re
import sys

BASE = {"common", "proto"}
LAYERS = {
    "consistency": set(),
    "cluster/membership": set(),
    "ps_server/optimizers": set(),
    "ps_server/core": {"ps_server/optimizers", "consistency", "placement"},
    "ps_server/shm": set(),
    "ps_server/service": {"ps_server/core", "ps_server/optimizers", "ps_server/shm",
                          "consistency", "placement", "rpc", "cluster/membership"},
    "worker/client": {"placement", "rpc"},
    "worker/report": {"worker/client"},
    "worker/session": {"worker/client", "consistency", "placement"},
    "worker/model": {"kernels", "placement", "data"},
    "worker/training": {"worker/client", "worker/session", "worker/report", "worker/model",
                        "consistency", "kernels", "placement", "data"},
    "worker/process": {"worker/client", "worker/session", "worker/report", "worker/model",
                       "worker/training", "consistency", "kernels", "placement", "data", "rpc"},
}
NO_GRPC = {"consistency", "ps_server/optimizers", "ps_server/core", "ps_server/shm"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
GRPC = re.compile(r"^(grpc|grpcpp)/|\.grpc\.pb\.h$")


def folder_of(header, tops):
    """The library folder (or top-level folder) a repository header lies in."""
    for layer in sorted(LAYERS, key=len, reverse=True):
        if header.startswith(layer + "/"):
            return layer
    top = header.split("/", 1)[0]
    return top if "/" in header and top in tops else None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tops = {n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))}
    findings = []
    for layer, allowed in LAYERS.items():
        path = os.path.join(root, layer)
        if not os.path.isfile(os.path.join(path, "CMakeLists.txt")):
            findings.append(f"{layer}/: no CMakeLists.txt; each layer is a library of its own")
            continue
        for name in sorted(os.listdir(path)):
            if not name.endswith((".h", ".cc")):
                continue
            text = open(os.path.join(path, name), encoding="utf-8").read()
            for header in INCLUDE.findall(text):
                if layer in NO_GRPC and GRPC.search(header):
                    findings.append(f"{layer}/{name}: includes {header}; {layer}/ has no gRPC")
                    continue
                folder = folder_of(header, tops)
                if folder is None or folder == layer or folder in BASE or folder in allowed:
                    continue
                findings.append(f"{layer}/{name}: includes {header}, from {folder}/, "
                                f"which {layer}/ may not depend on")
    for line in findings:
        print(line)
    if findings:
        print(f"{len(findings)} include(s) across the layers; move the code or change "
              "tests/scripts/layers_test.py's LAYERS (and docs/architecture.md's table) with it")
        return 1
    print(f"the {len(LAYERS)} layers include only from the layers below them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
