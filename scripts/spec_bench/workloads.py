"""The prompts: *edit* asks for a Python function back with one parameter renamed (300–800
tokens of code to copy, taken from this Python's own standard library, so every machine has the
same ones), *chat* asks open questions with nothing to copy (*chatN*: N clients at once), *mixed*
sends both at once from 8 clients, and *prediction* is *edit* with the original code as the
request's `prediction`. Four sets of modules and questions (PROMPT_SETS): `tuning`, which the
defaults were tuned on; `fresh`, written for reporting after that; `held-out`, written in session
21 after sessions 12-20 had looked at the fresh set's logs, and run first for its report;
`unseen`, written in session 24 after the held-out set had been run in four sessions."""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODULES = ("textwrap.py", "json/encoder.py", "json/decoder.py", "shlex.py", "fnmatch.py",
           "difflib.py", "argparse.py", "configparser.py", "string.py", "calendar.py")  # fmt: skip
QUESTIONS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how rain forms, step by step, for a curious ten-year-old.",
    "What are some good habits for learning a new language as an adult?",
    "Describe the city of Rome to someone visiting it for the first time.",
    "Why do we have seasons on Earth? Explain it simply.",
    "Give me advice for my first job interview at a small company.",
    "What makes a good friend? Give a few examples.",
    "How do bees make honey, and why do they need so much of it?",
)
# Not looked at while tuning (issue 30): the figures README reports come from these.
FRESH_MODULES = ("csv.py", "pprint.py", "tokenize.py", "gettext.py", "zipfile.py",
                 "netrc.py", "ftplib.py", "mailbox.py", "tabnanny.py", "optparse.py")  # fmt: skip
FRESH_QUESTIONS = (
    "Tell me about the history of the bicycle and how it changed cities.",
    "How would you plan a vegetable garden on a small balcony?",
    "Explain what a volcano is and why some of them erupt.",
    "Write a letter from a cat to its owner about the new sofa.",
    "What should I pack for a week of hiking in the mountains in autumn?",
    "Why is the sky blue during the day and red at sunset?",
    "Describe a busy morning market in a coastal town.",
    "How do airplanes stay in the air? Keep it simple.",
    "Give me ideas for a birthday party for a seven-year-old who loves dinosaurs.",
    "What are the pros and cons of working from home?",
    "Invent a recipe for a soup using only autumn vegetables.",
    "Explain how a library decides which books to buy.",
    "Write a short poem about a train crossing a snowy plain.",
    "How can a beginner start running without getting injured?",
    "What did people eat on long sea voyages three hundred years ago?",
    "Describe how a honeybee colony chooses a new home.",
)
# Written for session 21's report, after the second set had been looked at (issue 30).
HELD_OUT_MODULES = ("plistlib.py", "statistics.py", "fractions.py", "poplib.py", "locale.py",
                    "pickletools.py", "email/utils.py", "urllib/parse.py", "inspect.py",
                    "http/cookiejar.py")  # fmt: skip
HELD_OUT_QUESTIONS = (
    "What happens inside a seed when it starts to grow?",
    "Write a short diary entry of a lighthouse cat during a storm at sea.",
    "How did people tell the time before clocks were invented?",
    "Suggest a weekend plan for two friends visiting a small mountain village.",
    "Explain why bread rises when it bakes, without using chemistry words.",
    "What are good ways to keep a houseplant alive while travelling for two weeks?",
    "Describe the sounds of a forest at night for someone who has never been in one.",
    "Why do some birds fly south for the winter while others stay?",
    "Give a beginner's guide to choosing a first telescope.",
    "Write a friendly note from a neighbour asking to borrow a ladder.",
    "How does a bicycle stay upright when it is moving?",
    "What could a small town do to make its streets safer for children?",
    "Tell a short fable about a tortoise who wanted to learn to swim.",
    "Explain how glaciers carve valleys over thousands of years.",
    "What are some quiet hobbies that help people relax after work?",
    "Describe how a postal letter travels from one country to another.",
)
# Written for session 24's report, after the held-out set had been run in four sessions.
UNSEEN_MODULES = ("quopri.py", "base64.py", "heapq.py", "posixpath.py", "gzip.py", "uuid.py",
                  "tempfile.py", "dis.py", "functools.py", "ssl.py")  # fmt: skip
UNSEEN_QUESTIONS = (
    "How do whales talk to each other across the ocean?",
    "Write a short note a grandmother might leave in a cookbook she gives away.",
    "What should someone know before adopting an older dog?",
    "Explain why metal feels colder than wood in the same room.",
    "Plan a rainy afternoon for three children without screens.",
    "Describe an old clock repair shop from the point of view of a customer.",
    "Why do onions make people cry, and how can it be avoided?",
    "Tell a short legend about how a river got its name.",
    "What are sensible first steps for someone who wants to learn to sew?",
    "How do ships find their way across the sea without landmarks?",
    "Write a thank-you message to a bus driver who waited for you.",
    "What makes some cheeses have holes in them?",
    "Describe the first snowfall of the year in a busy city.",
    "Give tips for keeping a tidy desk when working on many projects.",
    "How did ancient builders move very heavy stones?",
    "Explain what an echo is and where you are likely to hear one.",
)
PROMPT_SETS = {
    "tuning": (MODULES, QUESTIONS),
    "fresh": (FRESH_MODULES, FRESH_QUESTIONS),
    "held-out": (HELD_OUT_MODULES, HELD_OUT_QUESTIONS),
    "unseen": (UNSEEN_MODULES, UNSEEN_QUESTIONS),
}
CHAT_MAX_TOKENS = 200
CHAT_CLIENTS = (4, 8, 16)  # the chatN workloads


@dataclass(frozen=True)
class Request:
    kind: str  # edit | chat | prediction
    messages: list[dict[str, str]]
    max_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)


def functions(
    tokenizer: Any,
    count: int,
    low: int = 300,
    high: int = 800,
    modules: tuple[str, ...] = MODULES,
) -> list[str]:
    """`count` standard-library functions of low..high tokens, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    for name in modules:
        source = (stdlib / name).read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.args.args:
                code = ast.get_source_segment(source, node) or ""
                if low <= len(tokenizer.encode(code)) <= high:
                    found.append(code)
                if len(found) == count:
                    return found
    return found


def edit(code: str, tokenizer: Any, prediction: bool) -> Request:
    fn = ast.parse(code).body[0]
    assert isinstance(fn, ast.FunctionDef)
    old = fn.args.args[0].arg
    ask = (
        f"Here is a Python function:\n\n```python\n{code}\n```\n\nRewrite it with the "
        f"parameter `{old}` renamed to `{old}_value`. Reply with the whole function only."
    )
    extra = {"prediction": {"type": "content", "content": code}} if prediction else {}
    return Request(
        "prediction" if prediction else "edit",
        [{"role": "user", "content": ask}],
        len(tokenizer.encode(code)) + 64,
        extra,
    )


def chat(i: int, questions: tuple[str, ...] = QUESTIONS) -> Request:
    question = questions[i % len(questions)]
    return Request("chat", [{"role": "user", "content": question}], CHAT_MAX_TOKENS)


def workloads(
    tokenizer: Any, prompts: int, prompt_set: str = "tuning"
) -> dict[str, list[list[Request]]]:
    """Per workload, its rounds: each round is the requests sent at once (one per client)."""
    modules, questions = PROMPT_SETS[prompt_set]
    codes = functions(tokenizer, max(prompts, 4), modules=modules)
    edits = [edit(c, tokenizer, False) for c in codes]
    out = {
        "edit": [[r] for r in edits[:prompts]],
        "chat": [[chat(i, questions)] for i in range(prompts)],
        "mixed": [edits[:4] + [chat(i, questions) for i in range(4)]],
        "prediction": [[edit(c, tokenizer, True)] for c in codes[:prompts]],
    }
    for n in CHAT_CLIENTS:
        out[f"chat{n}"] = [[chat(i, questions) for i in range(n)]]
    return out
