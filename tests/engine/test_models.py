"""The tiny model pairs: fast kinds build, load with transformers, and are cached once.

No vLLM here, but torch builds and runs models, seconds per test: so they run in this tier, and the
unit tier stays fast."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from specserve.models import KINDS, PairPaths, cache, cached_pair, make_pair
from specserve.models.__main__ import build_parser, main
from specserve.models.build import BUILD_INFO_FILE
from specserve.models.tokenizer import CHAT_TEMPLATE_FILE, VOCAB_SIZE, read_corpus, train_tokenizer


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, PairPaths]:
    root = tmp_path_factory.mktemp("pairs")
    return {kind: make_pair(kind, root / kind, progress=False) for kind in ("self", "random")}


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


@pytest.mark.parametrize("kind", ["self", "random"])
def test_pair_folders_load_with_transformers(built, kind):
    pair = built[kind]
    for model_dir in (pair.target, pair.draft):
        for name in (
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            CHAT_TEMPLATE_FILE,
        ):
            assert (model_dir / name).is_file(), name
        config = AutoConfig.from_pretrained(model_dir)
        assert config.model_type == "llama"
        assert config.vocab_size == VOCAB_SIZE
        assert config.max_position_embeddings >= 1024
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        assert model.dtype == torch.bfloat16
        logits = model(input_ids=torch.tensor([[1, 100, 200]])).logits
        assert logits.shape == (1, 3, VOCAB_SIZE)
    info = json.loads((pair.target.parent / BUILD_INFO_FILE).read_text())
    assert info["kind"] == kind


def test_tokenizer_has_specials_and_chat_template(built):
    tokenizer = AutoTokenizer.from_pretrained(built["self"].target)
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "<pad>"]) == [0, 1, 2, 3]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 3)
    text = "def main():\n    return 1\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "user: hi\nassistant:"


def test_self_draft_is_the_target_and_random_draft_is_not(built):
    target, draft = weights(built["self"].target), weights(built["self"].draft)
    assert target.keys() == draft.keys()
    assert all(torch.equal(target[name], draft[name]) for name in target)
    random_config = AutoConfig.from_pretrained(built["random"].draft)
    assert random_config.hidden_size < AutoConfig.from_pretrained(built["random"].target).hidden_size


def test_builds_are_deterministic(built, tmp_path):
    again = make_pair("random", tmp_path / "again", progress=False)
    for first, second in ((built["random"].target, again.target), (built["random"].draft, again.draft)):
        a, b = weights(first), weights(second)
        assert all(torch.equal(a[name], b[name]) for name in a)
    texts = read_corpus()
    first, second = train_tokenizer(texts), train_tokenizer(texts)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="'bogus'"):
        make_pair("bogus", Path("unused"))
    with pytest.raises(ValueError, match="'bogus'"):
        cached_pair("bogus", Path("unused"))


def test_cache_builds_once_and_returns_the_same_folder(tmp_path, monkeypatch):
    calls = []
    real_make_pair = cache.make_pair

    def counting_make_pair(kind, out_dir, **kw):
        calls.append(kind)
        return real_make_pair(kind, out_dir, **kw)

    monkeypatch.setattr(cache, "make_pair", counting_make_pair)
    first = cached_pair("self", tmp_path, progress=False)
    stamp = (first.target / "model.safetensors").stat().st_mtime_ns
    second = cached_pair("self", tmp_path, progress=False)
    assert first == second and calls == ["self"]
    assert (second.target / "model.safetensors").stat().st_mtime_ns == stamp
    assert first.target.parent == tmp_path / cache.cache_key("self")
    # Nothing is left behind but the pair and its lock file.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [cache.cache_key("self"), f".{cache.cache_key('self')}.lock"]
    )


def test_concurrent_cache_builders_build_once(tmp_path, monkeypatch):
    calls = []
    real_make_pair = cache.make_pair
    monkeypatch.setattr(
        cache, "make_pair", lambda kind, out, **kw: calls.append(kind) or real_make_pair(kind, out, **kw)
    )
    results: list[PairPaths] = []

    def fetch() -> None:
        results.append(cached_pair("random", tmp_path, progress=False))

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1] and calls == ["random"]


def test_cache_root_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    assert cache.cache_root() == tmp_path
    monkeypatch.delenv(cache.CACHE_ENV)
    assert cache.cache_root() == Path.home() / ".cache" / "specserve" / "models"


def test_cli_make_prints_paths_and_names_bad_values(tmp_path, capsys):
    assert set(KINDS) == {"trained", "self", "random", "perf"}
    assert main(["make", "--kind", "self", "--out", str(tmp_path / "p"), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"target": str(tmp_path / "p" / "target"), "draft": str(tmp_path / "p" / "draft")}
    measure = ["measure", "--target", printed["target"], "--draft", printed["draft"]]
    for argv, bad in (
        (["make", "--kind", "bogus", "--out", "x"], "'bogus'"),
        (["measure", "--target", str(tmp_path / "nope"), "--draft", "x"], "nope"),
        ([*measure, "--k", "0"], "'0'"),
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert bad in capsys.readouterr().err
