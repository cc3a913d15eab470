"""Build the model archives: the weights (fixed seed) and one .mar per config-<variant>.yaml.

    python examples/torchserve/build.py --out WORK [--variants eager ember openvino]

writes WORK/weights.pth and WORK/model_store/tinynet_<variant>.mar (torch-model-archiver).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import TinyNet  # noqa: E402


def weights(path: str) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = TinyNet()
        for m in model.modules():  # trained-looking batch-norm statistics, not the identity
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    torch.save(model.state_dict(), path)


def archive(out: str, variant: str) -> str:
    store = os.path.join(out, "model_store")
    os.makedirs(store, exist_ok=True)
    archiver = shutil.which("torch-model-archiver")
    if archiver is None:
        raise SystemExit("torch-model-archiver is not on PATH: pip install torch-model-archiver==0.12.0")
    cmd = [archiver, "--model-name", f"tinynet_{variant}", "--version", "1.0",
           "--model-file", os.path.join(HERE, "model.py"),
           "--serialized-file", os.path.join(out, "weights.pth"),
           "--handler", os.path.join(HERE, "ember_handler.py"),
           "--extra-files", os.path.join(HERE, "serving_protocol.py"),
           "--config-file", os.path.join(HERE, f"config-{variant}.yaml"),
           "--export-path", store, "--force"]
    subprocess.run(cmd, check=True)
    return os.path.join(store, f"tinynet_{variant}.mar")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", nargs="+", default=["eager", "ember", "openvino"])
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    weights(os.path.join(args.out, "weights.pth"))
    for v in args.variants:
        print(archive(args.out, v))


if __name__ == "__main__":
    main()
