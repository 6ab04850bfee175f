"""The small built-in text corpus the tiny tokenizer is trained on.

A handwritten core (chat, games, maths, tool calls) plus deterministic generated lines, so that
moves like `<move>5</move>`, numbers, JSON and ChatML tags tokenise into sensible pieces. It is
not training data for the model's weights: tiny models stay randomly initialised.
"""

from __future__ import annotations

import json
import random

CORE_TEXT = """\
You are a helpful assistant. Think step by step, then answer.
The user asks a question and the assistant answers it. Keep answers short and correct.
Let's play tic-tac-toe. You are X and I am O. The board cells are numbered 1 to 9.
Reply with your move as <move>N</move> where N is the number of an empty cell.
Invalid move: that cell is already taken. Try again with an empty cell.
You win! Three in a row. It's a draw. You lose. Game over. Your turn.
<think>The centre is free, so I take it.</think><move>5</move>
<think>I must block the row.</think><move>3</move>
Solve the problem. Put the final answer in \\boxed{}.
What is 12 + 30? The answer is \\boxed{42}.
If a train travels 60 km in 1.5 hours, its speed is 60 / 1.5 = 40 km/h.
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May? 48 / 2 = 24, 48 + 24 = 72. #### 72
<tool_call>
{"name": "calculator", "arguments": {"expression": "17 * 23"}}
</tool_call>
<tool_response>
391
</tool_response>
# Tools
You may call one or more functions to assist with the user query.
You are provided with function signatures within <tools></tools> XML tags:
For each function call, return a json object with function name and arguments within
<tool_call></tool_call> XML tags.
{"type": "function", "function": {"name": "search", "description": "Search the web",
"parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
system user assistant tool function arguments name content role description parameters
Observation: Action: Thought: Final Answer: Question: Answer: Reward: Feedback:
The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
Correct. Wrong answer. Please try again. Format error: no move found in your reply.
"""

_TOOLS = ("calculator", "search", "lookup", "python", "delegate", "read_file")


def _board_lines(rng: random.Random) -> list[str]:
    cells = [str(i) for i in range(1, 10)]
    for _ in range(rng.randint(0, 8)):
        cells[rng.randrange(9)] = rng.choice("XO")
    rows = [" | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
    move = rng.randint(1, 9)
    return [*rows, f"<think>Cell {move} looks good.</think><move>{move}</move>"]


def _math_line(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(1, 99)
    op = rng.choice("+-*/")
    value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 2)}[op]
    return f"Compute {a} {op} {b}. <think>{a} {op} {b} = {value}</think> \\boxed{{{value}}}"


def _tool_line(rng: random.Random) -> str:
    name = rng.choice(_TOOLS)
    args = {"expression": f"{rng.randint(1, 99)} * {rng.randint(1, 99)}"}
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def tiny_corpus(seed: int = 0, n_generated: int = 300) -> str:
    """The corpus text: the core plus `n_generated` deterministic lines of each kind."""
    rng = random.Random(seed)
    lines = [CORE_TEXT]
    for _ in range(n_generated):
        lines += _board_lines(rng)
        lines.append(_math_line(rng))
        lines.append(_tool_line(rng))
        lines.append("<|im_start|>user\nYour move.<|im_end|>\n<|im_start|>assistant\n")
    return "\n".join(lines)
