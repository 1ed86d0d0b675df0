"""Writes a random-weight Llama and its locally trained tokenizer: run by an engine environment's python.

This file is a script for the engine environment's interpreter (it has torch, transformers and
tokenizers; the project's has none of them), so it imports nothing of PD Forensics. Its words
(:func:`vocabulary_words`) need only the standard library: the project reads them to write
prompts the tokenizer knows. Nothing is loaded from a model hub.

    python model_script.py OUT_DIR LAYERS HIDDEN INTERMEDIATE HEADS
"""

from __future__ import annotations

import itertools
import json
import sys

VOCAB_SIZE = 8192  # the embedding's rows; the trained vocabulary is a little smaller
MAX_POSITIONS = 8192
SPECIAL_TOKENS = ["<unk>", "<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# Enough for /v1/chat/completions: each message as "<|role|> content", then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
_ONSETS = "b c d f g h j k l m n p r s t v w z".split()
_VOWELS = "a e i o u".split()


def vocabulary_words() -> list[str]:
    """The words the tokenizer is trained on, in a fixed order: syllable pairs (``ba``, ``bebo`` ...)."""
    syllables = [c + v for c, v in itertools.product(_ONSETS, _VOWELS)]
    words = list(syllables)
    words += [a + b for a, b in itertools.product(syllables, syllables)]
    return words[: VOCAB_SIZE - len(SPECIAL_TOKENS) - 64]


def main(out: str, layers: int, hidden: int, intermediate: int, heads: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    words = vocabulary_words()
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    trainer = trainers.WordLevelTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=SPECIAL_TOKENS)
    corpus = [" ".join(words[i:i + 64]) for i in range(0, len(words), 64)] + [". , ? ! : ; ' \" ( ) - 0 1 2 3 4 5 6 7 8 9"]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    print(json.dumps({"parameters": parameters, "vocabulary": tokenizer.get_vocab_size()}))


if __name__ == "__main__":
    main(sys.argv[1], *(int(v) for v in sys.argv[2:6]))
