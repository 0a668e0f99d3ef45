"""The synthetic trace's block ids against the rule by definition (synth's docstring): a
block is named by its identity (a system prompt's block, a conversation's own block, or a
prompt's partial last block), ids numbered in order of first use, block by block. The
same draws are made with ids given by definition; a negative control (conversations whose
own blocks share identities) shows the comparison can fail."""

from __future__ import annotations

import random

import pytest

from kvtier.replay import conversations as draws
from kvtier.replay.conversations import PromptIds, conversations
from kvtier.replay.synth import SynthConfig, generate


class IdsByDefinition:
    """``conversations.PromptIds``, each block looked up by its identity."""

    def __init__(self) -> None:
        self.shared: dict[tuple[object, ...], int] = {}
        self.own: dict[tuple[object, ...], int] = {}
        self.next = 0

    def new_conversation(self) -> None:
        self.own = {}

    def prompt(self, system: int, system_tokens: int, prompt: int, block_tokens: int
               ) -> tuple[int, ...]:
        ids = []
        for j in range(-(-prompt // block_tokens)):
            end = (j + 1) * block_tokens
            identity: tuple[object, ...]
            if end > prompt:
                identity = ("partial", j, prompt)
            elif end <= system_tokens:
                identity = ("system", system, j)
            else:
                identity = ("own", j)
            table = self.shared if identity[0] == "system" else self.own
            if identity not in table:
                table[identity], self.next = self.next, self.next + 1
            ids.append(table[identity])
        return tuple(ids)


class NeverForgets(IdsByDefinition):
    def new_conversation(self) -> None:
        pass


CONFIGS = [SynthConfig(users=30, turns=4, system_prompts=3, system_tokens=1000, seed=2),
           SynthConfig(users=20, turns=6, system_prompts=1, system_tokens=512, user_tokens=5,
                       output_tokens=3, seed=5)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("block_tokens", [512, 16, 7, 4096])
def test_ids_follow_the_rule(config: SynthConfig, block_tokens: int) -> None:
    got = generate(config, block_tokens)

    def drawn(ids: PromptIds) -> list[object]:
        return list(conversations(config, block_tokens, ids))

    assert got == drawn(IdsByDefinition())
    assert got != drawn(NeverForgets())


def test_the_written_out_draws_are_the_standard_librarys() -> None:
    """The conversations' lengths and gaps, drawn by the module's compiled copies of
    ``lognormvariate`` and ``expovariate``: the same values from the same seed."""
    for sigma, rate in [(0.5, 0.5), (1.0, 1 / 30), (0.1, 3.0)]:
        ours, theirs = random.Random(11), random.Random(11)
        for _ in range(2000):
            assert draws._lognormal(ours, sigma) == theirs.lognormvariate(0.0, sigma)
            assert draws._exponential(ours, rate) == theirs.expovariate(rate)
    assert draws._lognormal(random.Random(1), 0.5) != random.Random(2).lognormvariate(0.0, 0.5)
