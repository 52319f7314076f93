#!/usr/bin/env python3
"""PyTorch companion to gpu_bench: times the same training step in PyTorch.

For each 784-W-W-10 MLP (ReLU, softmax cross-entropy, fp32, TF32 off as in
pstrain's cuBLAS setup) and batch size, one step is: upload the batch from
pinned host memory, forward, loss, loss.item() (the host reads the loss, as
the pstrain worker does), backward, all on one GPU; the median of --repeats
steps after --warmup, timed with CUDA events around the step and a
synchronize after it. Prints "MODEL BATCH STEP_MS" lines for
`gpu_bench --torch_results=FILE`.

    python3 benchmarks/torch_step.py > torch.txt
    build/bin/gpu_bench --torch_results=torch.txt
"""
import argparse
import statistics
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="1024,2048,4096,8192")
    parser.add_argument("--batches", default="256,512,1024")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_step.py: error: PyTorch is not installed (import torch failed)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_step.py: error: PyTorch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda", args.gpu)
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(device)}")
    for width in (int(w) for w in args.widths.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            torch.manual_seed(1)
            model = torch.nn.Sequential(
                torch.nn.Linear(784, width), torch.nn.ReLU(),
                torch.nn.Linear(width, width), torch.nn.ReLU(),
                torch.nn.Linear(width, 10)).to(device)
            x_host = torch.rand(batch, 784).pin_memory()
            y_host = torch.randint(0, 10, (batch,)).pin_memory()
            loss_fn = torch.nn.CrossEntropyLoss()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)

            def step():
                for p in model.parameters():
                    p.grad = None
                x = x_host.to(device, non_blocking=True)
                y = y_host.to(device, non_blocking=True)
                loss = loss_fn(model(x), y)
                loss.item()
                loss.backward()

            for _ in range(args.warmup):
                step()
            torch.cuda.synchronize(device)
            times = []
            for _ in range(args.repeats):
                start.record()
                step()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            print(f"784-{width}-{width}-10 {batch} {statistics.median(times):.4f}", flush=True)
            del model
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
