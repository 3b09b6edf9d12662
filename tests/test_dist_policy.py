"""utils.dist_policy: the launch decisions. Their cases are tested through utils.dist in test_dist.py."""

import torch

from utils import dist, dist_policy


def test_utils_dist_imports_the_one_definition_of_each_decision():
    for name in ("NCCL_BACKEND", "choose_backend", "choose_start_method", "default_backend", "default_start_method"):
        assert getattr(dist, name) is getattr(dist_policy, name)


def test_outside_a_process_group_a_worker_uses_the_cpu():
    assert dist_policy.worker_device() == torch.device("cpu")


def test_defaults_follow_the_pure_rules_for_this_machine():
    assert dist_policy.default_backend(1) in ("gloo", dist_policy.NCCL_BACKEND)
    assert dist_policy.default_start_method() == ("spawn" if dist_policy.cuda_present() else "fork")
