import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from normalize.chat_tokenizer import ChatTokenizer

TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""A template that renders tool definitions in dict order, as Qwen- and Llama-style templates do."""


@pytest.fixture(scope="session")
def chat_tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load("smollm2-135m")


@pytest.fixture(scope="session")
def tokenizer_copy(
    chat_tokenizer: ChatTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., ChatTokenizer]:
    """A copy of the bundled tokenizer folder, with another chat template or tokenizer pipeline."""

    def make(template: str | None = None, edit: Callable[[Tokenizer], None] | None = None) -> ChatTokenizer:
        folder: Path = tmp_path_factory.mktemp("tokenizer")
        for file in chat_tokenizer.folder.iterdir():
            shutil.copy(file, folder / file.name)
        if template is not None:
            (folder / "chat_template.jinja").write_text(template)
        if edit is not None:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            edit(tokenizer)
            tokenizer.save(str(folder / "tokenizer.json"))
        return ChatTokenizer(folder)

    return make


@pytest.fixture(scope="session")
def tools_chat_tokenizer(tokenizer_copy: Callable[..., ChatTokenizer]) -> ChatTokenizer:
    return tokenizer_copy(template=TOOLS_TEMPLATE)
