"""ResNet-32 on a CIFAR-10-LT-shaped set: images/s and seconds per epoch of the real loop.

    python benchmarks/bench_resnet.py [--epochs 200] [--device auto] [--amp bf16|fp16|off]
                                      [--cuda-graph on|off]

The set has CIFAR-10-LT's shape at imbalance ratio 100 (exp profile: 12,406 uint8 32×32×3
training images, 5,000 … 50 per class, and a balanced 10,000-image test set), drawn at random
with a class-dependent mean colour so the numbers describe a run that learns; the real archive
needs a network (the `cifar10` dataset plugin fetches it in `dvc repro`). Each of CE (softmax)
and logit adjustment (τ = 1) trains with the LDAM-DRW recipe of
examples/studies/cifar10-lt-resnet32.yaml (SGD momentum 0.9, weight decay 2e-4, batch 128,
lr 0.1 with 5 warmup epochs and ×0.01 at 160 and 180, pad-4/crop/flip) through
tailkit.training.loop.train, the code `dvc repro` runs; the budget of epochs is ``--epochs``
(200 is the recipe; a lent GPU's 30 minutes hold about as many epochs as fit). Printed per
loss: training images/s, seconds per epoch (training time without validation), the test
accuracy of the last model and the device. On a CPU use ``--epochs 0.05`` for a smoke run.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from tailkit.native.device import resolve_device
from tailkit.output.output_layer import OutputLayer
from tailkit.pipeline.experiment import build_optimizer
from tailkit.registry import make_registry
from tailkit.training.loop import LoopConfig, train

CIFAR10_LT_100 = [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50]  # 12,406


def cifar10_lt_shaped(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """uint8 (N, 32, 32, 3) train and test images with CIFAR-10-LT's counts; each class's
    pixels scatter around its own colour, so accuracy is a sign of learning, not noise."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(40, 216, size=(10, 3))

    def draw(counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        labels = np.repeat(np.arange(10), counts)
        noise = rng.normal(0.0, 48.0, size=(labels.size, 32, 32, 3))
        images = np.clip(colours[labels][:, None, None, :] + noise, 0, 255).astype(np.uint8)
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))

    x_train, y_train = draw(CIFAR10_LT_100)
    x_test, y_test = draw([1000] * 10)
    return x_train, y_train, x_test, y_test


def run_one(loss_spec: dict, data, args, device: torch.device) -> dict[str, float]:
    registry = make_registry()
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(0)
    loss = registry.build("losses", loss_spec, "bench").to(device)
    model_spec = {"name": "resnet32", "amp": args.amp, "cuda_graph": args.cuda_graph == "on"}
    encoder = registry.build("models", model_spec, "bench", 32 * 32 * 3).to(device)
    layer = OutputLayer.for_loss(
        loss, 10, encoder.out_dim, device=device, generator=torch.Generator().manual_seed(0)
    )
    schedule = {"name": "step", "warmup_epochs": 5, "milestones": [160, 180], "gamma": 0.01}
    optimizer = build_optimizer(
        {
            "name": "sgd",
            "lr": 0.1,
            "momentum": 0.9,
            "weight_decay": 2e-4,
            "schedule": {**schedule, "interval": "epoch"},
        },
        "bench.optimizer",
    )
    steps_per_epoch = math.ceil(x_train.shape[0] / 128)
    cfg = LoopConfig(
        experiment=loss_spec["name"],
        epochs=args.epochs,
        batch_size=128,
        eval_every=steps_per_epoch * args.eval_epochs,
        checkpoint_every=10**9,
    )
    counts = torch.bincount(y_train, minlength=10).double()
    result = train(
        cfg=cfg,
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=None,
        optimizer=optimizer,
        x_train=x_train,
        y_train=y_train,
        x_val=x_test[:: max(1, x_test.shape[0] // 1000)],
        y_val=y_test[:: max(1, x_test.shape[0] // 1000)],
        class_counts=counts,
    )
    images = result.steps * 128
    epochs = result.steps / steps_per_epoch
    final = result.curve[-1] if result.curve else {}
    return {
        "images_per_second": images / result.seconds,
        "seconds_per_epoch": result.seconds / max(epochs, 1e-9),
        "epochs": epochs,
        "val_accuracy": final.get("val_accuracy", float("nan")),
        "val_balanced_accuracy": final.get("val_balanced_accuracy", float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=float, default=200.0)
    parser.add_argument("--eval-epochs", type=int, default=10, help="validate every n epochs")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--amp", default="bf16", choices=["bf16", "fp16", "off"])
    parser.add_argument(
        "--cuda-graph", default="on", choices=["on", "off"], help="replay the encoder (CUDA)"
    )
    args = parser.parse_args()
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    data = cifar10_lt_shaped()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"CIFAR-10-LT-shaped, ratio 100: {data[0].shape[0]:,} training images; {name}")
    for spec in ({"name": "softmax"}, {"name": "logit-adjusted", "tau": 1.0}):
        out = run_one(spec, data, args, device)
        print(
            f"{spec['name']:>15}: {out['images_per_second']:,.0f} images/s, "
            f"{out['seconds_per_epoch']:.2f} s/epoch over {out['epochs']:.2f} epochs, "
            f"last validation accuracy {100 * out['val_accuracy']:.2f} % "
            f"(balanced {100 * out['val_balanced_accuracy']:.2f} %), amp {args.amp}, "
            f"cuda graph {args.cuda_graph}"
        )


if __name__ == "__main__":
    main()
