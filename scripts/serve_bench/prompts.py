"""Fresh prompts: no request of a run shares its text with another (a serial number and random
words first), and long system messages of varied sentences for the multi-turn cases."""

from __future__ import annotations

import random
from typing import Any

Message = dict[str, str]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Words for prompts and the long system messages: varied, so the text is not one repeated token.
WORDS = _words(
    "river mountain cable memory token layer rank cluster window light morning quiet sea wind "
    "forest city market engine signal bridge harbor garden winter summer number letter paper "
    "copper silver glass stone cloud storm valley island planet orbit spring matrix vector "
    "kernel buffer socket thread packet router switch laptop screen keyboard battery charger "
    "pencil notebook library teacher student doctor farmer baker painter writer sailor pilot "
    "apple orange lemon cherry bread cheese coffee tea honey salt pepper butter rice noodle"
)
ADJECTIVES = _words(
    "small large quiet bright dark fast slow warm cold old new green blue red golden heavy light "
    "careful curious patient gentle silent busy sharp round narrow wide"
)
VERBS = _words(
    "carries reads writes splits shares moves holds finds builds counts sends measures watches "
    "follows opens closes crosses paints cooks teaches"
)


def user(text: str) -> Message:
    return {"role": "user", "content": text}


class Prompts:
    """Prompts no other request of the run shares: a unique number and random words first."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.serial = 0

    def question(self) -> str:
        self.serial += 1
        words = " ".join(self.rng.choice(WORDS) for _ in range(8))
        return f"{self.serial} {words}: what do they have in common? Answer briefly."

    def sentence(self) -> str:
        r = self.rng
        return (
            f"The {r.choice(ADJECTIVES)} {r.choice(WORDS)} {r.choice(VERBS)} "
            f"{r.randint(2, 999)} {r.choice(ADJECTIVES)} {r.choice(WORDS)}s near the "
            f"{r.choice(WORDS)} of the {r.choice(ADJECTIVES)} {r.choice(WORDS)}."
        )

    def system(self, tokenizer: Any, min_tokens: int) -> tuple[str, int]:
        """A system message of at least `min_tokens` tokens (counted with the model's own
        tokenizer), made of varied sentences."""
        head = f"You are assistant number {self.rng.randint(1, 10**9)}. Background notes follow."
        sentences = [head]
        count = len(tokenizer.encode(head).ids)
        while count < min_tokens:
            sentences += [self.sentence() for _ in range(8)]
            count = len(tokenizer.encode(" ".join(sentences)).ids)
        return " ".join(sentences), count
