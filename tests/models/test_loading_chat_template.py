"""A broken chat template is refused when the tokenizer loads (`load_tokenizer`, so `load_model`,
`ludic eval --model`, `ludic serve --model`), naming the file and the Jinja error, instead of
loading and failing at the first episode's prompt (or training on histories that lost the
policy's replies): a syntax error, a template that raises on a plain conversation, one that
renders no assistant turn. A tokenizer without a template still loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.models import load_model, load_tokenizer, tiny_model_dir

JINJA = "chat_template.jinja"
DROPS_ASSISTANT = (
    "{% for m in messages %}{% if m.role != 'assistant' %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_model_dir(), tmp_path / "m"))


def _refusal(folder: Path) -> str:
    with pytest.raises(ValueError) as e:
        load_tokenizer(folder)
    message = str(e.value)
    assert is_refusal(e.value) and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        (
            "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
            "the chat template does not compile at line 2 (TemplateSyntaxError: unexpected '}')",
        ),
        (
            "{{ messages[0].content.nothing_here() }}",
            "the chat template fails on a plain user / assistant / user conversation "
            "(UndefinedError: 'str object' has no attribute 'nothing_here')",
        ),
        (DROPS_ASSISTANT, "the chat template renders no assistant turn"),
    ],
    ids=["syntax-error", "raises", "drops-assistant"],
)
def test_a_broken_chat_template_is_refused_naming_the_file(
    folder: Path, template: str, problem: str
) -> None:
    (folder / JINJA).write_text(template)
    message = _refusal(folder)
    assert f"{folder / JINJA}: {problem}" in message, message
    with pytest.raises(ValueError, match="the chat template"):
        load_model(folder)


def test_a_template_in_tokenizer_config_json_is_named_there(folder: Path) -> None:
    """Older saves keep the template in tokenizer_config.json's chat_template."""
    (folder / JINJA).unlink()
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = "{% if %}"
    config_file.write_text(json.dumps(config))
    assert f"{config_file}: the chat template does not compile" in _refusal(folder)


def test_a_tokenizer_without_a_chat_template_loads(folder: Path) -> None:
    (folder / JINJA).unlink()
    assert load_tokenizer(folder).chat_template is None
