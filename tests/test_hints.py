"""utils.hints: passes exactly when torch.testing.assert_close does; otherwise names the element and the pattern."""

from __future__ import annotations

import pytest
import torch

from utils import hints


def _softmax_input() -> torch.Tensor:
    return torch.randn(8, 32, generator=torch.Generator().manual_seed(0)) * 3


def test_a_right_answer_passes_silently():
    x = _softmax_input()
    assert hints.assert_close(torch.softmax(x, -1), torch.softmax(x.double(), -1).float()) is None
    hints.assert_close({"w": [x, x + 1]}, {"w": [x.clone(), x + 1]}, rtol=0, atol=0)


def test_forgetting_the_row_sum_is_named_with_the_element_and_the_lab_hint():
    x = _softmax_input()
    expected = torch.softmax(x, -1)
    wrong = torch.exp(x - x.max(-1, keepdim=True).values)  # no division by the row sum
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(wrong, expected, lab="fused-softmax")
    message = str(info.value)
    assert info.value.pattern == "row_scaled"
    index = tuple(int(i) for i in (~torch.isclose(wrong, expected)).nonzero()[0])
    assert f"element [{index[0]}, {index[1]}] is {float(wrong[index]):.4g}, expected {float(expected[index]):.4g}" \
        in message
    assert "did you forget to divide by the row sum?" in message
    assert "Mismatched elements" in message  # torch's own report follows the hint


@pytest.mark.parametrize("make_wrong, pattern", [
    (lambda e: 0.5 * e, "scaled"),
    (lambda e: -e, "sign"),
    (lambda e: torch.zeros_like(e), "zeros"),
    (lambda e: torch.where(e > 1, torch.tensor(float("nan")), e), "nan"),
    (lambda e: torch.cat([e.flatten()[:-5], e.flatten()[-5:] + 1]).view_as(e), "tail"),
    (lambda e: e.t().contiguous(), "transposed"),
    (lambda e: e[:, :-1], "shape"),
    (lambda e: torch.where(torch.arange(e.numel()).view_as(e) % 7 == 3, e + 1, e), "some"),
])
def test_each_pattern_is_recognised(make_wrong, pattern):
    expected = torch.randn(6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 2
    wrong = make_wrong(expected)
    assert hints.diagnose(wrong, expected) == pattern
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(wrong, expected)
    assert info.value.pattern == pattern
    assert hints.GENERIC[pattern] in str(info.value)


def test_half_the_value_says_how_much():
    expected = torch.tensor([0.0823, 0.5, 1.0], dtype=torch.float64)
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(expected / 2, expected, lab="bellman-backups")
    assert "element [0] is 0.04115, expected 0.0823 (off by -0.0411, 0.5 times the expected value)" in str(info.value)
    assert hints.MISTAKES["bellman-backups"]["scaled"] in str(info.value)


def test_a_nested_result_names_the_path_of_the_first_mismatch():
    good = torch.ones(3)
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close({"a": good, "b": [good, 2 * good]}, {"a": good, "b": [good, good]})
    assert str(info.value).startswith("at ['b'][1]: element [0] is 2, expected 1")


def test_none_means_not_written_yet():
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(None, torch.ones(2))
    assert info.value.pattern == "none" and "returned None" in str(info.value)


def test_an_unknown_lab_is_refused():
    with pytest.raises(ValueError, match="unknown lab 'nope'"):
        hints.assert_close(torch.ones(1), torch.ones(1), lab="nope")


def test_every_lab_hint_belongs_to_a_known_pattern():
    for lab, table in hints.MISTAKES.items():
        assert set(table) <= set(hints.GENERIC), f"{lab}: {set(table) - set(hints.GENERIC)}"


def test_every_element_wrong_in_no_pattern_is_not_called_some():
    expected = torch.randn(6, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    wrong = torch.randn(6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert hints.diagnose(wrong, expected) == "some"
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(wrong, expected, lab="ring-attention")
    assert "Hint: every element differs, in no simple pattern: " + hints.MISTAKES["ring-attention"]["some"] \
        in str(info.value)
    assert "only some" not in str(info.value)
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(wrong, expected)  # no lab: no claim about indices either
    assert "every element differs" in str(info.value) and "only some" not in str(info.value)


def test_the_ring_lab_has_a_hint_for_each_stage_of_its_check():
    # the lab compares non-causal outputs, then causal contiguous, then zig-zag, then gradients, naming these tables
    for lab in ("ring-attention", "ring-attention-causal", "ring-attention-zigzag", "ring-attention-gradients",
                "ring-attention-work"):
        assert hints.MISTAKES[lab]["some"], lab
    assert "exp(m_old - m_new)" in hints.MISTAKES["ring-attention"]["some"]
    assert "positions(S, rank, P, layout)" in hints.MISTAKES["ring-attention-zigzag"]["some"]
    assert "detach" in hints.MISTAKES["ring-attention-gradients"]["some"]


def test_a_single_wrong_number_gets_how_far_off_but_no_pattern():
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_close(torch.tensor(0.75), torch.tensor(0.5), lab="post-training-dpo")
    assert info.value.pattern is None
    assert str(info.value).startswith("the value is 0.75, expected 0.5 (off by 0.25, 1.5 times the expected value)")


@pytest.mark.parametrize("actual, pattern, text", [
    ([5, 7, 9], "tail", "token 2 is 9, expected 8 (3 tokens, expected 3)"),
    ([5, 6, 8], "some", "token 1 is 6, expected 7 (3 tokens, expected 3)"),
    ([5, 7], "shape", "yours stops after 2 tokens, the expected goes on to 3"),
    ([5, 7, 8, 1], "shape", "yours goes on past the expected 3 tokens, to 4"),
    (None, "none", "got None"),
])
def test_token_sequences_are_compared_at_the_first_token_that_differs(actual, pattern, text):
    expected = torch.tensor([5, 7, 8])
    hints.assert_same_tokens([5, 7, 8], expected)  # a list against a tensor: equal, passes
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_same_tokens(actual, expected, lab="speculative-accept", msg="problem 3")
    assert info.value.pattern == pattern
    assert str(info.value).startswith(f"problem 3: {text}\nHint: {hints.TOKENS_SEEN[pattern]}: ")
    table = hints.MISTAKES["speculative-accept"]
    assert str(info.value).endswith(table.get(pattern, table["some"]))  # "none" is not listed: the lab's "some"


def test_token_ids_are_never_read_as_a_scale_factor():
    # [2, 6] against [1, 3] is "twice" as numbers, which means nothing for token ids
    with pytest.raises(hints.CheckFailed) as info:
        hints.assert_same_tokens([2, 6], [1, 3])
    assert info.value.pattern == "some" and "factor" not in str(info.value) and "twice" not in str(info.value)
    with pytest.raises(ValueError, match="unknown lab"):
        hints.assert_same_tokens([1], [1], lab="nope")


def test_part_5_and_the_moe_lab_have_tables_of_their_own():
    # every check of these labs names a table written for it, not another lab's (issue 32, "Reader experience")
    for prefix in ("serving-scheduler-", "serving-prefix-", "speculative-", "decode-", "quantise-", "moe-"):
        tables = [lab for lab in hints.MISTAKES if lab.startswith(prefix)]
        assert tables and all(hints.MISTAKES[lab] for lab in tables), prefix
