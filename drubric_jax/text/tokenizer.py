"""Tokenizers and chat formatting.

Two sources: the metadata of a GGUF file (byte-level BPE vocabulary, merges, special
tokens and chat template, rebuilt with the `tokenizers` library and wrapped in
`transformers.PreTrainedTokenizerFast`), or a Hugging Face directory (`AutoTokenizer`).
Chat text always comes from the model's own chat template.
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

import numpy as np

# Token strings that end a turn in the chat templates this project meets.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>")


def _gguf_strings(reader, name: str) -> list[str]:
    field = reader.fields[name]
    # An array field's `data` indexes the parts that hold its values.
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def tokenizer_from_gguf(path_or_reader):
    """Builds a tokenizer from a GGUF path (cached per path) or an open `gguf.GGUFReader`.

    See `_tokenizer_from_reader`.
    """
    if isinstance(path_or_reader, str):
        # Cached by absolute path: every role loading the same file shares one tokenizer.
        return _tokenizer_from_path(os.path.abspath(path_or_reader))
    return _tokenizer_from_reader(path_or_reader)


@functools.lru_cache(maxsize=4)
def _tokenizer_from_path(path: str):
    import gguf

    return _tokenizer_from_reader(gguf.GGUFReader(path))


def _tokenizer_from_reader(reader):
    """Builds a `PreTrainedTokenizerFast` from GGUF tokenizer metadata.

    Supports `tokenizer.ggml.model == "gpt2"` (byte-level BPE, as Llama 3, Qwen and
    SmolLM2 use). The pre-tokenizer is byte-level without a prefix space; special tokens
    (token_type 3, "control") are registered as special added tokens; no BOS is added by
    the tokenizer, as the GGUF's `add_bos_token` says for the default model.

    Raises:
        ValueError: unsupported tokenizer model in the file.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # A string field's value is its last part.
    kind = bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode()
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (gpt2 byte-level BPE)")
    tokens = _gguf_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _gguf_strings(reader, "tokenizer.ggml.merges")]
    types_field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(types_field.parts[i][0]) for i in types_field.data]

    # Byte-level BPE: every byte has a token, so no unknown token or byte fallback is needed.
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               fuse_unk=False, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    # token_type 3 is CONTROL (<|im_start|>, ...): never split, dropped by skip_special_tokens.
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])

    # GGUF stores special tokens as ids; the HF tokenizer takes their strings.
    def special(name):
        key = f"tokenizer.ggml.{name}_token_id"
        return tokens[int(reader.fields[key].parts[-1][0])] if key in reader.fields else None

    template = None
    if "tokenizer.chat_template" in reader.fields:
        template = bytes(reader.fields["tokenizer.chat_template"].parts[-1]).decode("utf-8")
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=special("bos"), eos_token=special("eos"),
        unk_token=special("unknown"), pad_token=special("padding"), chat_template=template,
        # Decoded text is returned as is (no space clean-up): texts are decoded and re-encoded.
        clean_up_tokenization_spaces=False)


def tokenizer_from_hf_dir(directory: str):
    """`transformers.AutoTokenizer` for a local Hugging Face directory (or hub id)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def chat_ids(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True,
             continue_final_message: bool = False) -> list[int]:
    """Token ids of `messages` rendered by the model's chat template.

    The template text already holds any BOS it wants, so the text is encoded without
    adding special tokens (no duplicated BOS).

    Args:
        messages: [{"role": "system"|"user"|"assistant", "content": str}, ...].
        add_generation_prompt: open an assistant turn at the end.
        continue_final_message: leave the last (assistant) message open for continuation.

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message)
    return tokenizer.encode(text, add_special_tokens=False)


def stop_ids(tokenizer) -> np.ndarray:
    """int32[n] ids that end a response: EOS first, then the end-of-turn tokens in the vocab."""
    # EOS first: the first stop id is also the policy's pad id and the constraint's forced stop.
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    vocab = tokenizer.get_vocab()
    ids += [vocab[t] for t in _END_OF_TURN if t in vocab and vocab[t] not in ids]
    if not ids:
        raise ValueError("tokenizer has neither an EOS token nor a known end-of-turn token")
    return np.array(ids, np.int32)
