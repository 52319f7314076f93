"""A worker script for an installed pstrain, NumPy only: fits w to a planted
vector by least squares through the PS's optimizer, and prints where the module came from and the
error before and after.
Run as pslaunch --ps=1 --workers=2 --learning_rate=0.1 -- python3 numpy_train.py."""

import numpy as np

import pstrain

TARGET = np.array([1.0, -2.0, 0.5, 3.0], np.float32)

client = pstrain.Client()
client.init({"w": np.zeros(4, np.float32)})
params = client.pull()
first = float(np.abs(params["w"] - TARGET).max())
for _ in range(60):
    params = client.push_pull({"w": (params["w"] - TARGET).astype(np.float32)})
last = float(np.abs(params["w"] - TARGET).max())
client.done()
print(f"module {pstrain.__file__} error {first:.3f} -> {last:.3f}", flush=True)
