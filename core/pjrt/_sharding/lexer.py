"""The lexer of the hand-written parsers of sharding text (XLA's and Shardy's): a token
stream over a regex of named groups."""
from __future__ import annotations

import re
from typing import Optional


class TokenStream:
    """Splits text with a regex of named groups (a ``space`` group is skipped) and hands the
    tokens out one by one; errors name the text, what it was meant to be and the offset."""

    def __init__(self, text: str, token_pattern: re.Pattern, what: str):
        self.text = text
        self.what = what
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            match = token_pattern.match(text, pos)
            if match is None:
                raise self.error(f"unexpected character {text[pos]!r}", pos)
            if match.lastgroup != "space":
                self.tokens.append((match.lastgroup, match.group(), pos))
            pos = match.end()
        self.index = 0

    def error(self, message: str, pos: Optional[int] = None) -> ValueError:
        if pos is None:
            pos = self.tokens[self.index][2] if self.index < len(self.tokens) else len(self.text)
        return ValueError(f"invalid {self.what} {self.text!r}: {message} at offset {pos}")

    def peek(self) -> Optional[str]:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def next(self) -> tuple[str, str, int]:
        if self.index >= len(self.tokens):
            raise self.error("unexpected end of text")
        self.index += 1
        return self.tokens[self.index - 1]

    def expect(self, value: str) -> None:
        _, text, pos = self.next()
        if text != value:
            raise self.error(f"expected {value!r}, found {text!r}", pos)

    def eat(self, value: str) -> bool:
        if self.peek() == value:
            self.index += 1
            return True
        return False

    def integer(self) -> int:
        kind, text, pos = self.next()
        if kind != "int":
            raise self.error(f"expected an integer, found {text!r}", pos)
        return int(text)
