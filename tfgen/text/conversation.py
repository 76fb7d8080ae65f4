"""A multi-turn conversation (what `tfgen chat` keeps between turns): an optional system message and the turns so
far, as the `{"role": ..., "content": ...}` messages a chat template renders, and saved as the `{"messages": [...]}`
object OpenAI's format (and a `tfgen batch` chat row) uses."""

from __future__ import annotations

import json
import os


class Conversation:
    """An optional system message and the user / assistant turns so far.

    system: the system message (None: none; the template may then write its own default, as SmolLM2's does).
    """

    def __init__(self, system: str | None = None):
        self.system = system
        self.turns: list[dict] = []

    def messages(self, next_user: str | None = None) -> list[dict]:
        """The messages to render: the system message when set, the turns, and `next_user` as a last user message
        when given (a copy: the conversation is unchanged)."""
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        pending = [] if next_user is None else [{"role": "user", "content": next_user}]
        return system + [dict(turn) for turn in self.turns] + pending

    def prompt_ids(self, tokenizer, next_user: str) -> list[int]:
        """The ids of the conversation with `next_user` as the last user message, rendered with `tokenizer`'s chat
        template and the assistant's turn opened: what the model continues with its answer."""
        return tokenizer.apply_chat_template(self.messages(next_user), add_generation_prompt=True)

    def add_turn(self, user: str, assistant: str) -> None:
        """Appends one exchange: the user's message and the assistant's answer."""
        self.turns += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]

    def reset(self) -> None:
        """Forgets the turns (the system message stays)."""
        self.turns = []

    def save(self, path: str | os.PathLike) -> None:
        """Writes `{"messages": [...]}` (the system message first when set) to `path` as UTF-8 JSON; OSError as
        `open` raises it."""
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"messages": self.messages()}, file, ensure_ascii=False, indent=2)
            file.write("\n")
