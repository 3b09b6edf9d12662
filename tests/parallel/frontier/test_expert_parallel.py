"""utils.parallel.frontier.expert_parallel: on 2 and 4 gloo ranks the expert-parallel layer equals the one-process
layer (routed in one group per rank), outputs and every gradient, dropped tokens included; the all-to-alls move the
bytes the formula says."""

import pytest
import torch
import torch.distributed as dist

from tests.parallel import value_error_messages
from utils.dist import launch
from utils.parallel.frontier import expert_parallel as ep
from utils.parallel.frontier.moe import MoELayer

TOL = dict(rtol=1e-5, atol=1e-6)
H, F, E, K, TOKENS = 16, 24, 8, 2, 12  # TOKENS per rank


def _case(world_size, router, capacity_factor):
    torch.manual_seed(0)
    layer = MoELayer(H, F, E, K, capacity_factor=capacity_factor, n_shared=1, router=router)
    with torch.no_grad():
        layer.router.weight[0] += 0.5  # a skewed router, so capacity bites
        layer.expert_bias.copy_(torch.linspace(-0.1, 0.1, E))
    x = torch.randn(world_size * TOKENS, H)
    upstream = torch.randn(world_size * TOKENS, H)
    return layer, x, upstream


def _compare(rank, world_size, router, capacity_factor):
    layer, x, up = _case(world_size, router, capacity_factor)
    xr = x.clone().requires_grad_(True)
    y_ref = layer(xr, groups=world_size)
    (y_ref * up).sum().backward()
    positions_ref, experts_ref = layer.last_positions, layer.last_experts

    model = ep.ExpertParallelMoE(layer)
    mine = slice(rank * TOKENS, (rank + 1) * TOKENS)
    model.zero_grad()
    xl = x[mine].clone().requires_grad_(True)
    y = model(xl)
    (y * up[mine]).sum().backward()
    torch.testing.assert_close(y, y_ref[mine].detach(), **TOL)
    torch.testing.assert_close(xl.grad, xr.grad[mine], **TOL)
    local = E // world_size
    for i, expert in enumerate(model.layer.experts):
        for name, p in expert.named_parameters():
            ref = dict(layer.experts[rank * local + i].named_parameters())[name]
            torch.testing.assert_close(p.grad, ref.grad, **TOL)
    replicated = [model.layer.router.weight, *model.layer.shared.parameters()]
    reference = [layer.router.weight, *layer.shared.parameters()]
    for p, ref in zip(replicated, reference):
        dist.all_reduce(p.grad)  # partial sums over each rank's tokens
        torch.testing.assert_close(p.grad, ref.grad, **TOL)
    assert torch.equal(model.layer.last_positions, positions_ref[mine])

    # Bytes: the padded buffer against the formula; the real tokens against the one-process routing.
    formula = ep.all_to_all_bytes(TOKENS, H, E, K, capacity_factor, world_size, element_size=4)
    assert model.last_bytes == {"dispatch": formula, "combine": formula}
    kept = positions_ref[mine] >= 0
    offrank = ((experts_ref[mine] // local) != rank) & kept
    assert model.last_token_bytes == int(offrank.sum()) * H * 4 <= formula
    return int((positions_ref < 0).sum())


@pytest.mark.parametrize("world_size", [1, 2, 4])  # 1: every all-to-all sends to itself
def test_expert_parallel_layer_equals_one_process(world_size):
    def run(rank, size):
        return [_compare(rank, size, router, cf) for router in ("softmax", "sigmoid_bias") for cf in (None, 1.0)]

    dropped = launch(run, world_size, timeout=120)[0]
    assert dropped[0] == 0 and dropped[2] == 0  # no capacity: nothing dropped
    assert dropped[1] > 0 and dropped[3] > 0  # capacity factor 1 with a skewed router: tokens dropped, still equal


def test_all_to_all_bytes_and_seconds():
    # 4096 tokens, h = 7168, 256 experts, k = 8, factor 1.25, EP 64, bf16: C = ceil(1.25 * 4096 * 8 / 256) = 160.
    nbytes = ep.all_to_all_bytes(4096, 7168, 256, 8, 1.25, 64, element_size=2)
    assert nbytes == 63 * 4 * 160 * 7168 * 2
    assert nbytes == pytest.approx(63 / 64 * 1.25 * 8 * 7168 * 2 * 4096)  # (P-1)/P * factor * k * h * e per token
    assert ep.all_to_all_seconds(1, 1e9, 1e9, 1e-5) == 0.0
    assert ep.all_to_all_seconds(8, 7e6, 1e9, 1e-5) == pytest.approx(7e-5 + 7e-3)


def _errors(rank, world_size):
    return value_error_messages([
        lambda: ep.ExpertParallelMoE(MoELayer(8, 8, n_experts=6, top_k=2)),  # 6 experts over 4 ranks
        lambda: ep.all_to_all(torch.zeros(6, 2)),
        lambda: ep.ExpertParallelMoE(torch.nn.Linear(2, 2)),
    ])


def test_bad_inputs_raise_value_error():
    messages = launch(_errors, 4, timeout=60)[0]
    assert "n_experts (6) must be divisible by the group size 4" in messages[0]
    assert "divisible by the group size 4" in messages[1]
    assert "MoELayer" in messages[2]
    with pytest.raises(ValueError, match="divisible by world_size"):
        ep.all_to_all_bytes(64, 8, 6, 2, 1.0, 4)
    with pytest.raises(ValueError, match="capacity_factor"):
        ep.all_to_all_bytes(64, 8, 8, 2, 0.0, 4)


def test_node_limited_route():
    torch.manual_seed(0)
    scores = torch.rand(500, 64).sigmoid()  # 64 experts on 8 nodes of 8
    experts = ep.node_limited_route(scores, 8, 8, 4)
    nodes = experts // 8
    assert max(len(set(row)) for row in nodes.tolist()) <= 4
    assert not torch.equal(experts.sort(1).values, scores.topk(8).indices.sort(1).values)  # the cap bites
    unlimited = ep.node_limited_route(scores, 8, 8, 8)  # every node allowed: plain top-k
    assert torch.equal(unlimited.sort(1).values, scores.topk(8).indices.sort(1).values)
    # The kept nodes are those with the largest sum of their top-2 scores.
    row = scores[0].view(8, 8)
    best = set(row.topk(2).values.sum(1).topk(4).indices.tolist())
    assert set(nodes[0].tolist()) <= best
    with pytest.raises(ValueError, match="multiple of max_nodes"):
        ep.node_limited_route(scores, 6, 8, 4)
    with pytest.raises(ValueError, match="divisible by experts_per_node"):
        ep.node_limited_route(scores, 8, 7, 4)


def test_published_figures():
    assert ep.PUBLISHED["deepseek_v3_nvlink_bytes_per_s"].value / ep.PUBLISHED["deepseek_v3_ib_bytes_per_s"].value \
        == pytest.approx(3.2)  # "roughly 3.2 times that of IB"


def _two_groups(rank, world_size):
    """Four ranks as two expert-parallel groups of two (beside data parallelism): each group equals the one-process
    layer on its own tokens, and the expert gradients all-reduced over the replicas (ranks r and r + 2) equal the sum
    of the two groups' one-process gradients."""
    ep_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    local_rank = rank % 2
    torch.manual_seed(0)
    layer = MoELayer(H, F, E, K, capacity_factor=1.0)
    grads = []
    for data_group in (0, 1):
        torch.manual_seed(1 + data_group)
        x, up = torch.randn(2 * TOKENS, H), torch.randn(2 * TOKENS, H)
        layer.zero_grad()
        y_ref = layer(x, groups=2)
        (y_ref * up).sum().backward()
        grads.append([p.grad.clone() for p in layer.experts.parameters()])
        if data_group == rank // 2:
            mine = slice(local_rank * TOKENS, (local_rank + 1) * TOKENS)
            model = ep.ExpertParallelMoE(layer, group=ep_groups[rank // 2])
            y = model(x[mine])
            (y * up[mine]).sum().backward()
            torch.testing.assert_close(y, y_ref[mine].detach(), **TOL)
    local = E // 2
    owned = [p for i in range(local_rank * local, (local_rank + 1) * local) for p in layer.experts[i].parameters()]
    total = {id(p): g0 + g1 for p, g0, g1 in zip(layer.experts.parameters(), *grads)}
    for p, ref in zip(model.layer.experts.parameters(), owned):
        dist.all_reduce(p.grad, group=replicas[local_rank])
        torch.testing.assert_close(p.grad, total[id(ref)], **TOL)
    return True


def test_expert_parallel_groups_inside_a_larger_world():
    assert all(launch(_two_groups, 4, timeout=120))


def test_node_limited_bytes_when_the_group_has_fewer_nodes_than_max_nodes():
    # EP 32 on 4 nodes of 8, M = 8, k = 8: a token can reach at most the 4 nodes there are, 3 of them remote,
    # so 100 tokens of h = 10 in 2 bytes send 100 * 3 * 10 * 2 = 6,000 bytes over the network (counting M = 8
    # visits would give 12,000), and 100 * 8 * 7/8 * 10 * 2 = 14,000 over NVLink.
    network, nvlink = ep.node_limited_all_to_all_bytes(100, 10, 8, 32, 8, 8, element_size=2)
    assert network == pytest.approx(6_000)
    assert nvlink == pytest.approx(14_000)
