"""The shared tokenizer of the tiny model pairs: byte-level BPE trained on Python's standard library.

The corpus is a fixed, sorted subset of the interpreter's own stdlib sources, so the tokenizer (and
the models trained on the same text) are reproducible on any machine with the same Python minor
version and need no download. Training the 1024-token BPE takes well under a second.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 1024
UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
# Special tokens take the first ids, in this order: <unk>=0, <s>=1, </s>=2, <pad>=3.
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)

# A plain "role: content" transcript, so /v1/chat/completions works against the tiny models.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# Every CORPUS_STRIDE-th top-level stdlib module in name order, skipping very large files, up to
# MAX_CORPUS_BYTES: about 2 MB of varied Python, enough for the tokenizer and a short training run.
CORPUS_STRIDE = 2
MAX_FILE_BYTES = 150_000
MAX_CORPUS_BYTES = 2_500_000


def corpus_files(stdlib_dir: Path | None = None) -> list[Path]:
    """The fixed subset of stdlib ``.py`` files the tokenizer and models are trained on."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    candidates = sorted(p for p in root.glob("*.py") if p.stat().st_size <= MAX_FILE_BYTES)
    chosen, total_bytes = [], 0
    for path in candidates[::CORPUS_STRIDE]:
        size = path.stat().st_size
        if total_bytes + size > MAX_CORPUS_BYTES:
            break
        chosen.append(path)
        total_bytes += size
    if not chosen:
        raise FileNotFoundError(f"no Python sources found under {root}")
    return chosen


def read_corpus(stdlib_dir: Path | None = None) -> list[str]:
    """The corpus as one string per source file, in a fixed order."""
    return [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files(stdlib_dir)]


def train_tokenizer(texts: list[str], *, model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts`` and wrap it for transformers and vLLM."""
    bpe = Tokenizer(models.BPE(unk_token=UNK))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, model_dir: Path) -> None:
    """Write the tokenizer files and the chat template into a model folder."""
    tokenizer.save_pretrained(model_dir)
    # transformers 5 writes the template itself; write it explicitly so the file's presence does not
    # depend on the transformers version.
    (model_dir / CHAT_TEMPLATE_FILE).write_text(CHAT_TEMPLATE, encoding="utf-8")
