"""The encoder's training forward and backward replayed from CUDA graphs.

A small convolutional encoder at a research batch size (ResNet-32, B = 128) launches some 600
kernels a step that each run for a few microseconds: the GPU waits on Python and the
dispatcher: the GPU computes 3.3 ms of a 13.4 ms step. Measured on an H200 (torch 2.11, bf16
autocast, 2026-11-26): the network's step alone, 13.4 ms eager and 3.3 ms replayed from
graphs; the training loop over CIFAR-10-LT-shaped data (benchmarks/bench_resnet.py, off and on
alternated in one session), 2.09–2.35 → 0.52–0.54 s an epoch (CE) and 1.60–1.80 → 0.50–0.53
(logit adjustment): ~6,000 → ~24,000 images/s.

:class:`GraphedEncoder` captures the encoder's forward and backward with
:func:`torch.cuda.make_graphed_callables` once per input shape before training starts (an
epoch has at most two: the batch and the last, shorter one), and replays them for training
batches of those shapes. Anything else runs the encoder as it is: evaluation mode, no-grad
calls, other shapes. Capturing up front, while no step's autograd graph is alive, keeps the
captured backward's gradient accumulation on the stream it was recorded on. An encoder opts in
with a true ``cuda_graph`` attribute (ResNet-32 does): capture needs a forward with no
data-dependent control flow, no host synchronisation and no random draws, which only the
encoder's author can promise.

Capture runs three warm-up steps on the sample batch, which would move BatchNorm's running
statistics (and its batch counter) three steps ahead; the encoder's buffers are saved before
and written back in place after, so a graphed run takes the steps an eager one takes. Replay
writes the embedding into the same memory each step: a loss that keeps a batch's embeddings
past its step must copy them (the memory losses do).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


class _Forward(nn.Module):
    """A module whose forward is the encoder's, so capture replaces this wrapper's ``forward``
    and leaves the encoder itself (its state dict, its eager forward) untouched."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class GraphedEncoder:
    """Calls ``encoder(x)``, replayed from a graph captured for each of ``samples``' shapes
    where the call is a training one (module docstring)."""

    def __init__(self, encoder: nn.Module, samples: Iterable[torch.Tensor]) -> None:
        self.encoder = encoder
        # Capture records the parameters' gradient accumulation on its side stream, so every
        # replayed backward that accumulates on the default stream trips torch's stream-mismatch
        # warning (torch >= 2.11). The mismatch is by construction and costs one stream wait a
        # step (measured in the 4x above); the warning would otherwise fire once per process.
        quiet = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)
        if quiet is not None:
            quiet(False)
        self._graphed: dict[tuple[Any, ...], Any] = {}
        for x in samples:
            if _key(x) not in self._graphed:
                self._graphed[_key(x)] = self._capture(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        graphed = self._graphed.get(_key(x))
        if graphed is None or not (self.encoder.training and torch.is_grad_enabled()):
            return self.encoder(x)
        return graphed(x)

    def _capture(self, x: torch.Tensor) -> Any:
        saved = [b.detach().clone() for b in self.encoder.buffers()]
        was_training = self.encoder.training
        wrapper = _Forward(self.encoder).train()
        graphed = torch.cuda.make_graphed_callables(wrapper, (x.detach().clone(),))
        with torch.no_grad():
            for buffer, value in zip(self.encoder.buffers(), saved, strict=True):
                buffer.copy_(value)
        self.encoder.train(was_training)
        return graphed


def _key(x: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(x.shape), x.dtype, x.device)


def wants_graphs(encoder: nn.Module, device: torch.device) -> bool:
    """Whether ``encoder`` on ``device`` is to be replayed from graphs: CUDA, and it opts in."""
    return device.type == "cuda" and bool(getattr(encoder, "cuda_graph", False))
