"""Incremental detokenization of a sequence's output, with stop strings.

Text is produced by the tokenizers library's ``DecodeStream`` (which waits for complete UTF-8
characters). When stop strings are set, the last ``len(longest stop) - 1`` characters are held
back, so a stop string split across tokens is never streamed before it is recognised.
"""

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [text for text in stop if text]
        self._stream = DecodeStream(skip_special_tokens=True)
        self._hold_back = max((len(text) for text in self.stop), default=1) - 1
        self.text = ""
        self._sent = 0
        self.stopped = False
        """True once a stop string appeared; ``text`` is then cut before it."""
        self.matched: str | None = None
        """The stop string that ended the text (the earliest, if several appeared at once)."""

    def add_token(self, token_id: int) -> None:
        if self.stopped:
            return
        piece = self._stream.step(self.tokenizer, token_id)
        if not piece:
            return
        search_from = max(0, len(self.text) - self._hold_back)
        self.text += piece
        for stop in self.stop:
            found = self.text.find(stop, search_from)
            if found != -1:
                self.text = self.text[:found]
                self.stopped = True
                self.matched = stop
                search_from = min(search_from, found)

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out; while not final, keep back what could start a stop string."""
        end = len(self.text) if final or self.stopped else max(self._sent, len(self.text) - self._hold_back)
        delta = self.text[self._sent : end]
        self._sent = end
        return delta
