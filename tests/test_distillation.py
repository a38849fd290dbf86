"""Knowledge distillation: the loss against torch's KL divergence, the task's teacher input and its flags."""
import argparse

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from timm_csm.losses import create_loss, loss_spec
from timm_csm.training import parse_args
from timm_csm.training.tasks import DistillationTask, select_task


def test_kd_loss_matches_its_formula():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(16, 7, generator=g), torch.randn(16, 7, generator=g)
    y = torch.randint(0, 7, (16,), generator=g)
    tau, alpha = 3.0, 0.7
    want = (1 - alpha) * F.cross_entropy(s, y) + alpha * tau ** 2 * F.kl_div(
        F.log_softmax(s / tau, 1), F.log_softmax(t / tau, 1), log_target=True, reduction="batchmean")
    got = create_loss("kd", temperature=tau, alpha=alpha)(s, y, t)
    assert torch.allclose(got, want, atol=1e-6)


def test_kd_loss_ignores_rows_and_takes_no_teacher_gradient():
    s = torch.randn(6, 4, requires_grad=True)
    t = torch.randn(6, 4, requires_grad=True)
    y = torch.tensor([0, 1, -100, 2, -100, 3])
    loss = create_loss("kd", alpha=0.5)(s, y, t)
    keep = y != -100
    want = create_loss("kd", alpha=0.5)(s[keep], y[keep], t[keep])
    assert torch.allclose(loss, want, atol=1e-6)
    loss.backward()
    assert t.grad is None and s.grad[~keep].abs().sum() == 0


def test_kd_loss_refuses_mismatched_teacher_logits():
    with pytest.raises(ValueError, match="teacher logits have shape"):
        create_loss("kd")(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), torch.randn(4, 5))


class _Recorder(nn.Module):
    num_classes = 3

    def __init__(self):
        super().__init__()
        self.seen = None
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        self.seen = x.clone()
        return self.fc(x.flatten(1))


def test_distillation_task_renormalises_the_student_input_for_the_teacher():
    teacher = _Recorder()
    teacher.pretrained_cfg = {"mean": (0.2,), "std": (0.5,)}
    student = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    task = DistillationTask(student, create_loss("kd"), teacher, (0.6,), (0.25,), loss_spec("kd"))
    x = torch.randn(5, 1, 2, 2)
    out = task({"pixel_values": x, "labels": torch.tensor([0, 1, 2, 0, 1]), "index": torch.arange(5)})
    raw = x * 0.25 + 0.6
    assert torch.allclose(teacher.seen, (raw - 0.2) / 0.5, atol=1e-6)
    assert out["loss"].requires_grad and set(out["terms"]) == {"ce", "kd"}
    assert not any(p.requires_grad for p in task.teacher.parameters())


@pytest.mark.parametrize("flags, message", [
    (["--loss", "ce", "--teacher", "x"], "--teacher is used by distillation losses"),
])
def test_teacher_flag_errors(flags, message):
    args = parse_args(["--dataset", "digits", *flags])
    with pytest.raises(ValueError, match=message):
        select_task(args, loss_spec(args.loss))


def test_kd_without_teacher_is_an_error():
    args = parse_args(["--dataset", "digits", "--loss", "kd"])
    assert select_task(args, loss_spec("kd")) is DistillationTask
    with pytest.raises(ValueError, match="needs --teacher"):
        DistillationTask.from_config(args, nn.Linear(2, 2), create_loss("kd"), 2, data_info={"mean": [0], "std": [1]})
