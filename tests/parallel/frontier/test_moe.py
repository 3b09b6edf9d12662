"""utils.parallel.frontier.moe: routers, the load-balancing loss against hand-worked cases and Hugging Face's form,
capacity and GShard's dropping order, and the layer against a token-by-token loop."""

import math

import pytest
import torch

from utils.parallel.frontier import moe


def _logits_of(probabilities):
    return torch.tensor(probabilities, dtype=torch.float64).log()  # softmax(log p) = p


def test_load_balancing_loss_hand_worked():
    # Two tokens, four experts, top-2. Opposite preferences: f = (1/2, 1/2, 1/2, 1/2) (sums to k = 2),
    # P = (1/4, 1/4, 1/4, 1/4): loss = 4 * 4 * (1/2 * 1/4) = 2 = k, the balanced value.
    balanced = _logits_of([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]])
    assert moe.load_balancing_loss(balanced, 2).item() == pytest.approx(2.0)
    # Same preference: f = (1, 1, 0, 0), P = (0.4, 0.3, 0.2, 0.1): loss = 4 * (0.4 + 0.3) = 2.8.
    skewed = _logits_of([[0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
    assert moe.load_balancing_loss(skewed, 2).item() == pytest.approx(2.8)
    # Top-1 (Switch): f = (1, 0, 0, 0), loss = 4 * 0.4 = 1.6; a uniform router scores 1.
    assert moe.load_balancing_loss(skewed, 1).item() == pytest.approx(1.6)
    assert moe.load_balancing_loss(torch.zeros(6, 3), 1).item() == pytest.approx(1.0)


def test_load_balancing_loss_equals_hugging_face_mixtral_form():
    """HF's load_balancing_loss_func: N * sum(mean(one_hot(top-k), dim=0) * mean(probs, dim=0)), written out here."""
    torch.manual_seed(0)
    logits = torch.randn(50, 8, requires_grad=True)
    probs = logits.softmax(-1)
    mask = torch.nn.functional.one_hot(probs.topk(2, dim=-1).indices, 8).float()  # (tokens, k, E)
    hf = (mask.mean(dim=0) * probs.mean(dim=0).unsqueeze(0)).sum() * 8
    ours = moe.load_balancing_loss(logits, 2)
    torch.testing.assert_close(ours, hf)
    grad_ours, = torch.autograd.grad(ours, logits)
    grad_hf, = torch.autograd.grad(hf, logits)
    torch.testing.assert_close(grad_ours, grad_hf)  # only P carries gradient in both


def test_softmax_router_is_mixtral_and_switch():
    torch.manual_seed(0)
    logits = torch.randn(10, 8)
    weights, experts = moe.route(logits, 2)
    top, idx = logits.topk(2, dim=-1)
    torch.testing.assert_close(weights, top.softmax(-1))  # Mixtral: softmax(TopK(x W_g))
    assert torch.equal(experts, idx)
    weights1, _ = moe.route(logits, 1, renormalize=False)  # Switch: the probability itself
    torch.testing.assert_close(weights1[:, 0], logits.softmax(-1).max(-1).values)


def test_sigmoid_router_bias_selects_but_does_not_weigh():
    torch.manual_seed(0)
    logits = torch.randn(6, 4)
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])  # forces expert 3 into every token's top-2
    weights, experts = moe.route(logits, 2, "sigmoid_bias", bias)
    assert (experts == 3).any(dim=1).all()
    s = logits.sigmoid()
    chosen = s.gather(1, experts)
    torch.testing.assert_close(weights, chosen / chosen.sum(1, keepdim=True))  # unbiased affinities
    _, unbiased = moe.route(logits, 2, "sigmoid_bias")
    assert torch.equal(unbiased, s.topk(2, dim=-1).indices)


def test_bias_update_rule_and_that_it_balances():
    bias = torch.zeros(4)
    experts = torch.tensor([[0], [0], [0], [1], [1], [2], [2], [3]])  # loads 3, 2, 2, 1; mean 2
    torch.testing.assert_close(moe.update_expert_bias(bias, experts, 0.1), torch.tensor([-0.1, 0.0, 0.0, 0.1]))
    # A router that prefers expert 0 for every token: the bias alone brings the load towards the mean.
    torch.manual_seed(0)
    logits = torch.randn(256, 8) + torch.tensor([2.0, 1.0, 0, 0, 0, 0, 0, 0])

    def imbalance(b):
        return moe.expert_load(moe.route(logits, 2, "sigmoid_bias", b)[1], 8).max().item() / (256 * 2 / 8)

    start = imbalance(bias := torch.zeros(8))
    for _ in range(300):
        bias = moe.update_expert_bias(bias, moe.route(logits, 2, "sigmoid_bias", bias)[1], 0.01)
    assert start > 2.5 and imbalance(bias) < 1.2


def test_capacity_and_dropping_order():
    assert moe.expert_capacity(64, 8, 2, 1.25) == math.ceil(1.25 * 64 * 2 / 8) == 20
    assert moe.expert_capacity(10, 4, 1, 1.0) == 3  # ceil(2.5)
    assert moe.expert_capacity(10, 4, 2, None) == 10
    experts = torch.tensor([[0], [0], [0], [1]])
    assert moe.positions_in_experts(experts, 2, 2).flatten().tolist() == [0, 1, -1, 0]
    # Top-2: every first choice is served before any second choice (GShard), tokens in order within a choice.
    experts = torch.tensor([[1, 0], [0, 1], [0, 1]])
    positions = moe.positions_in_experts(experts, 2, 2)
    assert positions.tolist() == [[0, -1], [0, 1], [1, -1]]


def _loop_reference(layer, x, weights, experts, positions):
    """The layer's output token by token: shared experts plus the kept routed experts, weighted."""
    rows = []
    for t in range(x.shape[0]):
        y = sum((s(x[t]) for s in layer.shared), torch.zeros(x.shape[1]))
        for j in range(experts.shape[1]):
            if positions[t, j] >= 0:
                y = y + weights[t, j] * layer.experts[experts[t, j]](x[t])
        rows.append(y)
    return torch.stack(rows)


@pytest.mark.parametrize("router", moe.ROUTERS)
@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_layer_equals_a_token_by_token_loop(router, capacity_factor):
    torch.manual_seed(0)
    layer = moe.MoELayer(16, 24, n_experts=4, top_k=2, capacity_factor=capacity_factor, n_shared=1, router=router)
    x = torch.randn(32, 16)
    y = layer(x)
    weights, experts = moe.route(layer.router(x), 2, router, layer.expert_bias)
    positions = layer.last_positions
    dropped = int((positions < 0).sum())
    assert dropped == 0 if capacity_factor is None else dropped > 0
    torch.testing.assert_close(y, _loop_reference(layer, x, weights, experts, positions), rtol=1e-5, atol=1e-6)


def test_groups_route_each_slice_with_its_own_capacity():
    torch.manual_seed(0)
    layer = moe.MoELayer(8, 16, n_experts=4, top_k=2, capacity_factor=1.0)
    x = torch.randn(24, 8)
    torch.testing.assert_close(layer(x, groups=3), torch.cat([layer(c) for c in x.split(8)]), rtol=1e-6, atol=1e-6)


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="top_k must be at most n_experts=4"):
        moe.route(torch.randn(3, 4), 5)
    with pytest.raises(ValueError, match="top_k must be at most"):
        moe.load_balancing_loss(torch.randn(3, 4), 5)
    with pytest.raises(ValueError, match="top_k must be at most"):
        moe.MoELayer(8, 8, n_experts=2, top_k=3)
    with pytest.raises(ValueError, match="router_logits must be a tensor of shape"):
        moe.load_balancing_loss(torch.randn(4), 1)
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.expert_capacity(8, 4, 1, 0.0)
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.MoELayer(8, 8, n_experts=2, top_k=1, capacity_factor=-1.0)
    with pytest.raises(ValueError, match="capacity"):
        moe.positions_in_experts(torch.zeros(3, 1, dtype=torch.long), 2, 0)
    with pytest.raises(ValueError, match="router must be one of"):
        moe.route(torch.randn(3, 4), 1, "hash")
    with pytest.raises(ValueError, match="expert_bias must have shape"):
        moe.route(torch.randn(3, 4), 1, "sigmoid_bias", torch.zeros(3))
    layer = moe.MoELayer(8, 8, n_experts=2, top_k=1)
    with pytest.raises(ValueError, match=r"x must have shape \(tokens, 8\)"):
        layer(torch.randn(4, 6))
    with pytest.raises(ValueError, match="multiple of groups"):
        layer(torch.randn(5, 8), groups=2)


def test_sigmoid_router_always_renormalises_by_hand():
    # Affinities s = (0.8, 0.6, 0.2, 0.5): the top-2 are experts 0 and 1, weighted 0.8 / 1.4 = 4/7 and
    # 0.6 / 1.4 = 3/7 (DeepSeek-V3 eq. 13), whatever renormalize says; unrenormalised would be 0.8 and 0.6.
    s = torch.tensor([[0.8, 0.6, 0.2, 0.5]], dtype=torch.float64)
    logits = (s / (1 - s)).log()  # sigmoid(logit(s)) = s
    for renormalize in (True, False):
        weights, experts = moe.route(logits, 2, "sigmoid_bias", renormalize=renormalize)
        assert experts.tolist() == [[0, 1]]
        torch.testing.assert_close(weights, torch.tensor([[4 / 7, 3 / 7]], dtype=torch.float64))
