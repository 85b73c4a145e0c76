from pathlib import Path

from pdmesh.engine.detokenizer import IncrementalDetokenizer
from pdmesh.tokenizer import Tokenizer


def feed(tok: Tokenizer, text: str, stop: tuple[str, ...], include: bool = False):  # type: ignore[no-untyped-def]
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer.for_prompt(tok, [tok.bos_token_id or 0], stop, include, True)
    for i, t in enumerate(ids):
        hit = d.add(t)
        if hit:
            return d, hit, i + 1, len(ids)
    return d, None, len(ids), len(ids)


def test_incremental_text_equals_full_decode(llama_dir: Path) -> None:
    tok = Tokenizer(llama_dir)
    text = "def f(x):\n    return {'naïve': x ** 2}  # ünïcödé ✓"
    d, hit, _, _ = feed(tok, text, ())
    assert hit is None and d.text == text


def test_stop_string_spanning_tokens_is_found_and_cut(llama_dir: Path) -> None:
    tok = Tokenizer(llama_dir)
    text = "first line\nreturn value; END_OF_PART and more"
    stop = "; END_OF_PART"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert not any(stop in p for p in pieces)  # no single token holds it
    d, hit, consumed, total = feed(tok, text, (stop, "never"))
    assert hit == stop and consumed < total
    assert d.text == "first line\nreturn value"
    d, hit, _, _ = feed(tok, text, (stop,), include=True)
    assert d.text == "first line\nreturn value; END_OF_PART"
