"""Divergences: hand-computed values, special cases, and agreement with TRL's generalized_jsd_loss."""

import math

import pytest
import torch

from draftwheel.training import losses

# Two-token vocabulary, one position: teacher p = (0.5, 0.5), student q = (0.25, 0.75).
P = torch.tensor([0.5, 0.5])
Q = torch.tensor([0.25, 0.75])
P_LOGITS = P.log().view(1, 2)
Q_LOGITS = Q.log().view(1, 2)


def test_forward_kl_hand_computed():
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert losses.forward_kl(Q_LOGITS, P_LOGITS).item() == pytest.approx(expected, abs=1e-6)


def test_reverse_kl_hand_computed():
    expected = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert losses.reverse_kl(Q_LOGITS, P_LOGITS).item() == pytest.approx(expected, abs=1e-6)


def test_total_variation_hand_computed():
    assert losses.total_variation(Q_LOGITS, P_LOGITS).item() == pytest.approx(0.25, abs=1e-6)


def test_jsd_hand_computed_at_half():
    m = 0.5 * P + 0.5 * Q
    expected = 0.5 * (P * (P / m).log()).sum() + 0.5 * (Q * (Q / m).log()).sum()
    value = losses.generalized_jsd(Q_LOGITS, P_LOGITS, beta=0.5).item()
    assert value == pytest.approx(expected.item(), abs=1e-6)
    assert value <= math.log(2)  # the JSD is bounded by log 2


def test_jsd_beta_zero_and_one_reduce_to_the_kls():
    torch.manual_seed(0)
    student, teacher = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    assert torch.allclose(losses.generalized_jsd(student, teacher, beta=0.0), losses.forward_kl(student, teacher))
    assert torch.allclose(losses.generalized_jsd(student, teacher, beta=1.0), losses.reverse_kl(student, teacher))


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_identical_distributions_give_zero(name):
    logits = torch.randn(2, 4, 9)
    assert losses.divergence(name, logits, logits.clone()).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_different_distributions_give_positive_and_gradients(name):
    torch.manual_seed(1)
    student = torch.randn(2, 4, 9, requires_grad=True)
    value = losses.divergence(name, student, torch.randn(2, 4, 9))
    value.backward()
    assert value.item() > 0
    assert student.grad is not None and student.grad.abs().sum() > 0


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_agrees_with_trl(beta, temperature):
    from trl.experimental.gkd import GKDTrainer

    torch.manual_seed(2)
    student, teacher = torch.randn(2, 6, 17), torch.randn(2, 6, 17)
    labels = torch.randint(0, 17, (2, 6))
    labels[0, :2] = -100
    ours = losses.generalized_jsd(student, teacher, beta, mask=labels != -100, temperature=temperature)
    theirs = GKDTrainer.generalized_jsd_loss(student, teacher, labels=labels, beta=beta, temperature=temperature)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)


def test_mask_selects_positions_and_reductions():
    torch.manual_seed(3)
    student, teacher = torch.randn(1, 4, 7), torch.randn(1, 4, 7)
    per_position = losses.forward_kl(student, teacher, reduction="none")
    mask = torch.tensor([[False, True, True, False]])
    assert losses.forward_kl(student, teacher, mask).item() == pytest.approx(per_position[0, 1:3].mean().item())
    assert losses.forward_kl(student, teacher, mask, reduction="sum").item() == pytest.approx(
        per_position[0, 1:3].sum().item(), rel=1e-6)
    empty = torch.zeros(1, 4, dtype=torch.bool)
    assert losses.forward_kl(student, teacher, empty).item() == 0.0


def test_temperature_flattens_towards_zero_divergence():
    torch.manual_seed(4)
    student, teacher = torch.randn(4, 9), torch.randn(4, 9)
    assert losses.forward_kl(student, teacher, temperature=10.0) < losses.forward_kl(student, teacher)


def test_invalid_arguments_raise_naming_the_argument():
    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match="beta"):
        losses.generalized_jsd(logits, logits, beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        losses.forward_kl(logits, logits, temperature=0.0)
    with pytest.raises(ValueError, match="reduction"):
        losses.forward_kl(logits, logits, reduction="avg")
    with pytest.raises(ValueError, match="loss"):
        losses.divergence("l2", logits, logits)


def test_dense_logits_from_topk_is_a_distribution_matching_the_kept_entries():
    torch.manual_seed(5)
    full = torch.log_softmax(torch.randn(3, 20) * 3, dim=-1)
    values, indices = full.topk(5, dim=-1)
    dense = losses.dense_logits_from_topk(values, indices, 20)
    assert torch.allclose(dense.exp().sum(-1), torch.ones(3), atol=1e-5)
    assert torch.allclose(dense.gather(-1, indices), values)
    # With k = V the reconstruction is exact.
    values, indices = full.topk(20, dim=-1)
    exact = losses.dense_logits_from_topk(values, indices, 20)
    assert torch.allclose(exact.exp(), full.exp(), atol=1e-6)
