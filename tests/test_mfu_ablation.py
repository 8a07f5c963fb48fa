"""bench.mfu_ablation on a CPU: every switch a CPU can run trains a tiny ViT for 50 steps, and its loss curve stays
within the noise of eager fp32 (two eager seeds' difference); the comparison does tell a changed training apart
(a doubled learning rate); the CUDA-only switches skip with their reason; bf16 weights with fp32 master weights
keep the updates that bf16 alone rounds away, as fp32 arithmetic says; the compiler's cache goes where asked."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from bench.mfu_ablation import Ablation, inductor_cache, run
from bench.mfu_switches import CPU_SPEC, ROWS, MasterWeights, Row, curve, curve_data, mean_gap, skip_reason, trainer

COMPILED = {name for name, row in ROWS.items() if row.compile is not None}


@pytest.fixture(scope="module")
def ablation() -> tuple[Ablation, float]:
    torch.set_num_threads(1)
    a = Ablation(CPU_SPEC, "cpu", CPU_SPEC.steps)
    return a, a.floor()


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in COMPILED else n for n in ROWS], ids=list(ROWS)
)
def test_switch_keeps_the_eager_curve_on_cpu(ablation, name):
    a, floor = ablation
    reason = skip_reason(ROWS[name], "cpu")
    if reason:
        pytest.skip(reason)
    result = a.measure(ROWS[name])
    assert len(result.losses) == 50 and result.ips > 0
    # eager learns over the 50 steps (the curve means something), and the switch's curve is within noise of it
    eager = a.reference(ROWS[name].batch_scale)
    assert sum(eager[-10:]) < sum(eager[:10])
    assert result.gap <= floor, f"{name}: gap {result.gap:.4f} to eager, noise floor {floor:.4f}"


def test_a_changed_training_is_outside_noise(ablation):
    """The comparison can fail: the same model at twice the learning rate leaves eager's curve."""
    a, floor = ablation
    doubled = dataclasses.replace(CPU_SPEC, lr=2 * CPU_SPEC.lr)
    losses = curve(trainer(Row(), doubled, "cpu"), curve_data(CPU_SPEC, "cpu"), CPU_SPEC.steps)
    assert mean_gap(a.reference(1), losses) > floor


def test_cuda_only_switches_skip_on_cpu_with_their_reason():
    reasons = {name: skip_reason(row, "cpu") for name, row in ROWS.items()}
    assert {n for n, r in reasons.items() if r} == {"cuda-graphs", "max-autotune", "sdpa-efficient"}
    assert "CUDA graphs" in reasons["cuda-graphs"] and "CUDA-only" in reasons["sdpa-efficient"]
    assert not any(skip_reason(row, "cuda") for row in ROWS.values())


def test_master_weights_keep_updates_that_bf16_rounds_away():
    """SGD, lr 1e-3, gradient 1 on a weight of 1.0: in bf16 (spacing 2^-7 near 1) each step rounds back to 1.0;
    with fp32 master weights ten steps give 0.99 (fp32's own sum), rounded to bf16 once."""

    def run_steps(master: bool) -> torch.Tensor:
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.ones_(model.weight)
        sgd = lambda params: torch.optim.SGD(params, lr=1e-3)  # noqa: E731
        opt = MasterWeights(model, sgd) if master else None
        model = model.to(torch.bfloat16)
        opt = opt or sgd(list(model.parameters()))
        for _ in range(10):
            model.weight.grad = torch.ones_like(model.weight)
            opt.step()
            opt.zero_grad()
        return model.weight.detach()

    expected = torch.tensor(1.0)
    for _ in range(10):
        expected = expected - 1e-3
    assert run_steps(master=False).item() == 1.0
    assert run_steps(master=True).item() == expected.to(torch.bfloat16).item() != 1.0


def test_table_on_cpu_prints_rows_and_skips(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unchanged")
    cache = inductor_cache(str(tmp_path / "cache"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache") and "cold" in cache
    (tmp_path / "cache" / "x").write_text("")
    assert "warm" in inductor_cache(str(tmp_path / "cache"))
    spec = dataclasses.replace(CPU_SPEC, steps=20)
    run(spec, "cpu", ["eager", "sdpa-efficient", "fused-adamw"], deadline=float("inf"), peak=None, cache=cache)
    out = capsys.readouterr().out
    assert "| eager |" in out and "within noise |" in out
    assert "| sdpa-efficient |" in out and "skipped: SDPA's memory-efficient kernel is CUDA-only" in out
    assert "fastest within noise:" in out
