"""tailkit/output/dense_optim.py: the encoder's SGD and Adagrad leave every parameter bit for
bit where torch.optim's leave it, over several steps and a changing learning rate; their state
dicts load into each other; building them does not import torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tailkit.output.dense_optim import DenseAdagrad, DenseSGD


def _pair(seed: int = 0) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    return ours, theirs


def _steps(ours_opt, theirs_opt, ours, theirs, steps: int = 6) -> None:
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        lr = 0.1 / (1 + step)  # the schedule sets each step's lr, as Optimizer.step_dense does
        for group in (*ours_opt.param_groups, *theirs_opt.param_groups):
            group["lr"] = lr
        for a, b in zip(ours, theirs, strict=True):
            grad = torch.randn(a.shape, generator=g)
            if step == 2 and a.dim() == 1:
                a.grad = b.grad = None  # a parameter without a gradient is left alone
            else:
                a.grad, b.grad = grad.clone(), grad.clone()
        ours_opt.step()
        theirs_opt.step()
        ours_opt.zero_grad(set_to_none=True)
        theirs_opt.zero_grad(set_to_none=True)
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b), f"step {step}"


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"momentum": 0.9},
        {"momentum": 0.9, "nesterov": True},
        {"momentum": 0.5, "weight_decay": 0.01},
        {"weight_decay": 0.1},
    ],
)
def test_sgd_steps_bit_for_bit_as_torch(options):
    ours, theirs = _pair()
    _steps(
        DenseSGD(ours, lr=0.1, **options),
        torch.optim.SGD(theirs, lr=0.1, foreach=False, **options),
        ours,
        theirs,
    )


@pytest.mark.parametrize("accumulator", [0.0, 0.1])
def test_adagrad_steps_bit_for_bit_as_torch(accumulator):
    ours, theirs = _pair(2)
    _steps(
        DenseAdagrad(ours, lr=0.1, eps=1e-10, initial_accumulator_value=accumulator),
        torch.optim.Adagrad(
            theirs, lr=0.1, eps=1e-10, initial_accumulator_value=accumulator, foreach=False
        ),
        ours,
        theirs,
    )


def test_state_dicts_load_both_ways_and_resume_identically():
    ours, theirs = _pair(3)
    mine = DenseAdagrad(ours, lr=0.1, initial_accumulator_value=0.1)
    torchs = torch.optim.Adagrad(theirs, lr=0.1, initial_accumulator_value=0.1, foreach=False)
    _steps(mine, torchs, ours, theirs, steps=3)
    # torch's state into ours and ours into torch's: the next steps still agree
    swapped_ours = DenseAdagrad(ours, lr=0.1, initial_accumulator_value=0.1)
    swapped_ours.load_state_dict(torchs.state_dict())
    swapped_torch = torch.optim.Adagrad(theirs, lr=0.1, initial_accumulator_value=0.1)
    swapped_torch.load_state_dict(mine.state_dict())
    _steps(swapped_ours, swapped_torch, ours, theirs, steps=3)
    sgd_ours, sgd_theirs = _pair(4)
    a = DenseSGD(sgd_ours, lr=0.1, momentum=0.9)
    b = torch.optim.SGD(sgd_theirs, lr=0.1, momentum=0.9, foreach=False)
    _steps(a, b, sgd_ours, sgd_theirs, steps=2)
    resumed = DenseSGD(sgd_ours, lr=0.1, momentum=0.9)
    resumed.load_state_dict(b.state_dict())
    _steps(resumed, b, sgd_ours, sgd_theirs, steps=2)


def test_a_sparse_gradient_is_refused():
    p = torch.nn.Parameter(torch.zeros(4, 2))
    p.grad = torch.zeros(4, 2).to_sparse()
    with pytest.raises(TypeError, match="sparse gradient"):
        DenseSGD([p], lr=0.1).step()


def test_building_and_stepping_does_not_import_dynamo():
    code = (
        "import sys, torch\n"
        "from tailkit.output.dense_optim import DenseAdagrad, DenseSGD\n"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
        "DenseAdagrad([p], lr=0.1).step(); DenseSGD([p], lr=0.1, momentum=0.9).step()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
