"""Capstone 2 on two processes: a trainer rank and an engine rank, weights sent over gloo, sync or one step async.

Rank 0 trains (part 4's GRPO with :func:`~utils.capstone.grpo_engine.tis_grpo_loss`); rank 1 serves the policy
with part 5's engine and samples the rollouts. Per step:

- the engine sends the batch (token ids and its log-probs) to the trainer (``dist.send``);
- the trainer scores it, trains, and broadcasts every parameter to the engine (``dist.broadcast`` from
  rank 0, one message per tensor, as an RLHF system's NCCL weight broadcast does); the engine copies them
  in place (:meth:`~utils.serving.runtime.engine.Engine.update_weights`).

``mode="sync"``: the engine waits for the new weights before sampling the next batch, so every batch is
on-policy and the two ranks take turns. ``mode="async"``: the engine samples batch ``t + 1`` with the
weights it holds as soon as it has sent batch ``t``, then takes the weights of step ``t``: batch ``t + 1``
is one policy version stale and generation overlaps training (OpenRLHF's and TRL's asynchronous
trainers; part 4's chapter 8, section 3.4). Each rank records how long each phase took, so the overlap
and the sync's bytes and seconds are measured, not modelled.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from utils.capstone.engine_rollouts import engine_rollouts, new_engine, pretrained_llama
from utils.capstone.grpo_engine import Settings, sample_seeds, tis_grpo_loss
from utils.dist import launch
from utils.rl.objectives import grpo_advantages
from utils.rl.post_training import arithmetic_reward, frozen_copy
from utils.rl.tiny_lm import MAX_RESPONSE, SEQ_LEN, all_prompts, response_mask, token_logprobs

MODES = ("sync", "async")
TRAINER, ENGINE = 0, 1


@dataclass
class RankTimes:
    """Seconds per step of each phase on one rank, and the step's wall time."""

    phases: dict[str, list[float]] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    sync_bytes: int = 0
    reward: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    check: dict = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.phases.setdefault(phase, []).append(seconds)


def _broadcast_weights(model: torch.nn.Module) -> int:
    """Send (rank 0) or receive (other ranks) every parameter, in ``named_parameters`` order; returns the bytes."""
    nbytes = 0
    with torch.no_grad():
        for _, p in model.named_parameters():
            buffer = p.detach() if dist.get_rank() == TRAINER else torch.empty_like(p)
            dist.broadcast(buffer, src=TRAINER)
            if dist.get_rank() != TRAINER:
                p.copy_(buffer)
            nbytes += buffer.numel() * buffer.element_size()
    return nbytes


def _engine_rank(mode: str, s: Settings, seed: int) -> RankTimes:
    base, _ = pretrained_llama()
    incoming = copy.deepcopy(base)  # the received weights land here, then go into the engine in place
    n = s.prompts_per_step * s.group_size
    engine = new_engine(copy.deepcopy(base), n)
    g = torch.Generator().manual_seed(seed)
    times = RankTimes()

    def generate(step: int):
        picks = torch.randint(100, (s.prompts_per_step,), generator=g).tolist()
        start = time.perf_counter()
        roll = engine_rollouts(engine, [all_prompts()[i] for i in picks], s.group_size, sample_seeds(seed, step, n))
        times.add("generate", time.perf_counter() - start)
        return roll

    def send(roll) -> None:
        dist.send(roll.sequences, TRAINER)
        dist.send(roll.logprobs, TRAINER)

    def receive_weights() -> None:
        start = time.perf_counter()
        times.sync_bytes = _broadcast_weights(incoming)
        engine.update_weights(incoming.named_parameters())
        times.add("receive weights", time.perf_counter() - start)

    roll = generate(0)
    for step in range(s.steps):
        t0 = time.perf_counter()
        send(roll)
        if step + 1 == s.steps:
            receive_weights()
        elif mode == "async":
            roll = generate(step + 1)  # with the weights held now: overlaps the trainer's step
            receive_weights()
        else:
            receive_weights()
            roll = generate(step + 1)
        times.step_seconds.append(time.perf_counter() - t0)
    # After the last sync: these seeds' rollouts must be what the trainer's final weights sample.
    check_seeds = sample_seeds(seed, 10 ** 6, 8)
    after = engine_rollouts(engine, [all_prompts()[17]], 8, check_seeds)
    times.check = {"sequences": after.sequences, "seeds": check_seeds}
    return times


def _trainer_rank(mode: str, s: Settings, seed: int) -> RankTimes:
    base, _ = pretrained_llama()
    policy, ref = copy.deepcopy(base).train(), frozen_copy(base)
    opt = torch.optim.Adam(policy.parameters(), lr=s.lr)
    n = s.prompts_per_step * s.group_size
    times = RankTimes()
    for step in range(s.steps):
        t0 = time.perf_counter()
        seq = torch.empty(n, SEQ_LEN, dtype=torch.long)
        behaviour = torch.empty(n, MAX_RESPONSE, dtype=torch.float64)
        start = time.perf_counter()
        dist.recv(seq, ENGINE)
        dist.recv(behaviour, ENGINE)
        times.add("wait for batch", time.perf_counter() - start)
        start = time.perf_counter()
        rewards = arithmetic_reward(seq).double()
        advantages, mask = grpo_advantages(rewards, s.group_size), response_mask(seq)
        with torch.no_grad():
            logp_old, logp_ref = token_logprobs(policy, seq), token_logprobs(ref, seq)
        times.add("log-probs", time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(s.inner_epochs):
            loss = tis_grpo_loss(token_logprobs(policy, seq), logp_old, logp_ref, behaviour, advantages, mask,
                                 s.clip, s.beta, s.cap)
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.add("train", time.perf_counter() - start)
        start = time.perf_counter()
        times.sync_bytes = _broadcast_weights(policy)
        times.add("send weights", time.perf_counter() - start)
        times.reward.append(rewards.mean().item())
        times.staleness.append(int(mode == "async" and step > 0))
        times.step_seconds.append(time.perf_counter() - t0)
    times.check = {"policy": {k: v.detach().clone() for k, v in policy.state_dict().items()}}
    return times


def _rank(rank: int, world_size: int, mode: str, s: Settings, seed: int) -> RankTimes:
    torch.set_num_threads(1)
    return (_trainer_rank if rank == TRAINER else _engine_rank)(mode, s, seed)


def run(mode: str = "async", settings: Settings = Settings(steps=8), seed: int = 0,
        timeout: float = 300) -> tuple[RankTimes, RankTimes]:
    """Train on a trainer rank and an engine rank; returns ``(trainer's times, engine's times)``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    pretrained_llama()  # train (or load) once in the parent, not in both workers at once
    trainer, engine = launch(_rank, 2, mode, settings, seed, backend="gloo", timeout=timeout)
    return trainer, engine
