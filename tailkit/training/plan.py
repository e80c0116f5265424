"""What a label-sharded run needs per process, before it is run: ``tailkit plan``.

The output layer and the optimiser's per-row state are built for the largest shard on torch's
meta device, by the code a run allocates them with (:class:`OutputLayer`, the optimiser's
``attach`` and ``row_tables``, :func:`~tailkit.distributed.world.shard_range`), so their bytes
are the ones training would hold and change with it. A step's activations and the bytes a
process sends are counted from the step's shapes (tailkit/training/loop.py and
tailkit/distributed/ops.py): in full mode the logits of its labels and their gradient (or,
chunked, one chunk's and its rows' gradient: tailkit/distributed/chunked_logits.py), the
gathered embeddings and their gradient's all-reduce, and the (B,) softmax statistics; in
sampled mode the (B, 1 + m) logits, all-reduced (the global draw of the distributed design
note, §3.3). Ring collectives move about (W − 1)/W of a tensor per process, all-reduce twice
that.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from tailkit.distributed.chunked_logits import chunk_width
from tailkit.distributed.world import LABEL_BLOCK, shard_range
from tailkit.errors import InvalidParameterError
from tailkit.output.optim import OPTIMIZERS
from tailkit.output.output_layer import OutputLayer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Plan:
    """Bytes per process of the largest shard, and per step."""

    num_classes: int
    dim: int
    nproc: int
    dtype: str
    optimizer: str
    batch_size: int
    negatives: int | None  # None: full mode (every label scored)
    label_chunk: int | None  # full mode: labels a chunk, None when the logits are held whole
    labels_per_rank: int
    layer_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    sent_bytes_per_step: int

    @property
    def total_bytes(self) -> int:
        """Output layer, optimiser state and one step's activations, per process."""
        return self.layer_bytes + self.optimizer_bytes + self.activation_bytes


def plan(
    num_classes: int,
    dim: int,
    nproc: int,
    *,
    dtype: str = "fp32",
    optimizer: str = "adagrad",
    batch_size: int = 4096,
    negatives: int | None = None,
    block: int = LABEL_BLOCK,
    label_chunk: int | str | None = "auto",
) -> Plan:
    """The :class:`Plan` of ``nproc`` processes sharing ``num_classes`` labels of a ``dim``-wide
    output layer (``negatives`` None: full softmax; else sampled with that many per row).
    ``label_chunk`` is ``train.label_chunk``: a full step over more of a process's labels is
    chunked (:func:`~tailkit.distributed.chunked_logits.chunk_width`)."""
    widest = max(
        stop - start
        for start, stop in (shard_range(num_classes, r, nproc, block) for r in range(nproc))
    )
    layer = OutputLayer(widest, dim, device="meta")
    layer.weight, layer.bias = layer.weight.to(DTYPES[dtype]), layer.bias.to(DTYPES[dtype])
    opt = OPTIMIZERS[optimizer](**({"momentum": 0.9} if optimizer == "sgd" else {}))
    opt.attach(layer, [])
    size = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    share = (nproc - 1) / nproc  # of a tensor a ring collective moves per process
    width = chunk_width(label_chunk, batch_size, widest) if negatives is None else None
    if width is not None:
        # one chunk's products (turned into their gradient in place), its rows' weight and
        # bias gradient, and the embeddings' gradient the backward accumulates
        activations = (batch_size * width + width * (dim + 1) + batch_size * dim) * size
        sent = batch_size * dim * size * 3 * share + 3 * 2 * batch_size * 4 * share
    elif negatives is None:
        activations = 2 * batch_size * widest * size  # logits and their gradient
        # gathered Z, its gradient's all-reduce (2×), and the softmax's max, Σexp and pick
        sent = batch_size * dim * size * 3 * share + 3 * 2 * batch_size * 4 * share
    else:
        activations = 2 * batch_size * (1 + negatives) * 4
        sent = batch_size * dim * size * 3 * share + 2 * batch_size * (1 + negatives) * 4 * share
    return Plan(
        num_classes=num_classes,
        dim=dim,
        nproc=nproc,
        dtype=dtype,
        optimizer=optimizer,
        batch_size=batch_size,
        negatives=negatives,
        label_chunk=width,
        labels_per_rank=widest,
        layer_bytes=_bytes(layer.state_dict().values()),
        optimizer_bytes=_bytes(opt.row_tables().values()),
        activation_bytes=activations,
        sent_bytes_per_step=round(sent) if nproc > 1 else 0,
    )


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def describe(p: Plan) -> str:
    """The plan as a few lines of text (what ``tailkit plan`` prints)."""
    mode = "full softmax" if p.negatives is None else f"sampled, {p.negatives} negatives a row"
    if p.label_chunk is not None:
        mode += f" in chunks of {p.label_chunk:,} labels"
    setup = f"{p.nproc} process(es), {p.dtype}, {p.optimizer}, batch {p.batch_size:,}, {mode}"
    rows = [
        f"{p.num_classes:,} labels × {p.dim} dims, {setup}",
        f"labels per process (largest shard): {p.labels_per_rank:,}",
        f"output layer        {_gb(p.layer_bytes)}",
        f"optimizer state     {_gb(p.optimizer_bytes)}",
        f"step activations    {_gb(p.activation_bytes)}",
        f"total per process   {_gb(p.total_bytes)}",
        f"sent per step       {_gb(p.sent_bytes_per_step)}",
    ]
    return "\n".join(rows)


def as_dict(p: Plan) -> dict:
    return {**asdict(p), "total_bytes": p.total_bytes}


def _gb(n: int) -> str:
    return f"{n / 1e9:10.3f} GB"


def device_memory(device: torch.device) -> int:
    """The bytes a process can hope to hold on ``device``: a GPU's memory, else the machine's
    physical memory."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_step_fits(
    owner: str,
    *,
    num_classes: int,
    dim: int,
    batch_size: int,
    negatives: int | None,
    label_chunk: int | str | None,
    nproc: int,
    device: torch.device,
) -> None:
    """Refuse, in one line naming ``owner``'s settings, a run whose planned bytes per process
    (:func:`plan`) exceed all of the device's memory: it could only die allocating, with a
    traceback (``negatives: 2147483647`` asked torch for terabytes)."""
    p = plan(num_classes, dim, nproc, batch_size=batch_size, negatives=negatives,
             label_chunk=label_chunk)  # fmt: skip
    have = device_memory(device)
    if p.total_bytes <= have:
        return
    knobs = "negatives or batch_size" if negatives is not None else "batch_size or label_chunk"
    shown = f" --negatives {negatives}" if negatives is not None else ""
    raise InvalidParameterError(
        f"{owner}: a training step needs ~{p.total_bytes / 1e9:,.1f} GB per process (`tailkit "
        f"plan --num-classes {num_classes} --dim {dim} --nproc {nproc} --batch-size "
        f"{batch_size}{shown}`), more than the {have / 1e9:,.1f} GB of this {device.type}; "
        f"lower {knobs}"
    )
