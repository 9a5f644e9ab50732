"""Build the tokenizer shipped inside dynamoctl (source ``builtin``).

    python -m dynamoctl.tokenizer.build_builtin           # rewrite dynamoctl/tokenizer/builtin/
    python -m dynamoctl.tokenizer.build_builtin --check   # exit 1 if the shipped files are stale

A byte-level BPE in the layout of Llama 3 (its pre-tokenizer split, ``<|begin_of_text|>``
added by the post-processor, special tokens at the end of the vocabulary, a Llama-3 chat
template), trained on the fixed corpus of :mod:`dynamoctl.tokenizer._corpus`. It exists so
that the zero-infrastructure setup (the ``mocker`` engine) has a real tokenizer and chat
template without downloading anything; it is not meant to tokenise well for a real model.

The output is deterministic: the corpus is generated without floats or :mod:`random`, the
BPE trainer breaks ties by pair ids, and the JSON is written with sorted keys. So rebuilding
gives byte-identical files on any machine, and ``--check`` can guard them in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from dynamoctl.tokenizer import _corpus

VOCAB_SIZE = 8192
"""Total vocabulary, special tokens included (a power of two, as engines like)."""

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS = (BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT)
"""Llama 3's names. They get the last ids, as in Llama 3, so ids 0..255 stay the raw bytes."""

# Llama 3's pre-tokenizer split: contractions, words with at most one leading non-letter,
# digits in groups of at most three, punctuation runs, newlines, other whitespace.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3's prompt layout (a header per turn, <|eot_id|> after each), with two extensions so
# the frontend can pass OpenAI messages as they come: content given as a list of parts
# (text parts are concatenated) and tool calls. Tools are described in the system turn and
# tool results use Llama 3.1's "ipython" role; calls are rendered as Llama 3.1's JSON.
CHAT_TEMPLATE = r"""
{%- macro render(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable -%}
        {%- for part in content if part['type'] == 'text' -%}
            {{- part['text'] -}}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set ns.system = render(messages[0]['content']) | trim -%}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
    {%- if ns.system -%}
        {%- set ns.system = ns.system + '\n\n' -%}
    {%- endif -%}
    {%- set ns.system = ns.system + 'You can call the functions below. To call one, reply with'
        + ' only a JSON object {"name": function name, "parameters": {argument: value}}.' -%}
    {%- for tool in tools -%}
        {%- set ns.system = ns.system + '\n\n' + tool | tojson(indent=4) -%}
    {%- endfor -%}
{%- endif -%}
{%- if ns.system -%}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' + ns.system + '<|eot_id|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- set role = 'ipython' if message['role'] == 'tool' else message['role'] -%}
    {{- '<|start_header_id|>' + role + '<|end_header_id|>\n\n' -}}
    {%- if message['tool_calls'] -%}
        {%- for call in message['tool_calls'] -%}
            {%- set fn = call['function'] if call['function'] is defined else call -%}
            {%- set args = fn['arguments'] -%}
            {{- '{"name": ' + fn['name'] | tojson + ', "parameters": ' -}}
            {{- (args if args is string else args | tojson) + '}' -}}
            {%- if not loop.last -%}{{- '\n' -}}{%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- render(message['content']) | trim -}}
    {%- endif -%}
    {{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
""".strip()

OUT_DIR = Path(__file__).resolve().parent / "builtin"
"""Where the shipped files live (package data of ``dynamoctl.tokenizer``)."""


def train(texts: Sequence[str], vocab_size: int = VOCAB_SIZE) -> HFTokenizer:
    """Train the byte-level BPE on ``texts`` and add the special tokens and post-processor."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            # use_regex=False: the split above replaces GPT-2's regex, as in Llama 3.
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        # All 256 bytes, seen or not: what makes every UTF-8 string encodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
    )
    return tok


def built_with() -> str:
    """The installed ``tokenizers`` release, major.minor (what training output depends on)."""
    return ".".join(tokenizers.__version__.split(".")[:2])


def _dump(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build_files(texts: Sequence[str] | None = None, vocab_size: int = VOCAB_SIZE) -> dict[str, str]:
    """The builtin tokenizer's files (name -> content), trained on ``texts`` (default: the
    shipped corpus). Pure: writes nothing."""
    tok = train(_corpus.texts() if texts is None else texts, vocab_size)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tokenizer_config = {
        # The transformers layout, so AutoTokenizer can load this directory too.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "bos_token": BOS,
        "eos_token": EOS,
        "chat_template": CHAT_TEMPLATE,
        # Our decode never cleans up spaces; say so, so transformers agrees.
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        # Another tokenizers release may train differently; the up-to-date test reads this.
        "dynamoctl_build": {
            "command": "python -m dynamoctl.tokenizer.build_builtin",
            "tokenizers": built_with(),
        },
    }
    config = {
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_token_id": ids[BOS],
        # Generation stops at the end of a turn as well as at the end of text (Llama 3.1).
        "eos_token_id": [ids[EOS], ids[EOT]],
        "_name_or_path": "dynamoctl-builtin",
    }
    return {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": _dump(tokenizer_config),
        "config.json": _dump(config),
    }


def stale_files(files: dict[str, str], out_dir: Path) -> list[str]:
    """Names in ``files`` whose content differs from (or is missing in) ``out_dir``."""
    stale = []
    for name, content in sorted(files.items()):
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != content:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build (or with ``--check``, verify) the builtin tokenizer."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamoctl.tokenizer.build_builtin",
        description=(__doc__ or "").split("\n")[0],
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files are stale"
    )
    args = parser.parse_args(argv)
    files = build_files()
    if args.check:
        stale = stale_files(files, args.out)
        if stale:
            print(
                f"stale in {args.out}: {', '.join(stale)}; "
                "rebuild with: python -m dynamoctl.tokenizer.build_builtin",
                file=sys.stderr,
            )
            return 1
        print(f"{args.out}: up to date")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        # newline="": write exactly these bytes on every OS (the check compares them).
        (args.out / name).write_text(content, encoding="utf-8", newline="")
        print(f"wrote {args.out / name} ({len(content.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
