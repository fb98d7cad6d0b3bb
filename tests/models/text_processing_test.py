import collections

import pytest

pytestmark = pytest.mark.tf_only


def _strings(ragged):
    return [[t.decode("utf-8") for t in row] for row in ragged.to_list()]


def test_character_split_case_folds_unicode():
    from keras_attention.models.text_processing import split_text

    tokens = split_text(["Août 5", "ÉTÉ", ""], "character", lowercase=True)
    assert _strings(tokens) == [["a", "o", "û", "t", " ", "5"], ["é", "t", "é"], []]
    kept = split_text(["Août"], "character", lowercase=False)
    assert _strings(kept) == [["A", "o", "û", "t"]]


def test_whitespace_split():
    from keras_attention.models.text_processing import split_text

    tokens = split_text(["  Le  chat\tnoir ", ""], "whitespace", lowercase=True)
    assert _strings(tokens) == [["le", "chat", "noir"], []]


@pytest.mark.parametrize("split", ["whitespace", "wordpiece"])
@pytest.mark.parametrize("lowercase", [True, False])
def test_every_unicode_space_separates_words_and_tokens_stay_utf8(split, lowercase):
    # tf_text's WhitespaceTokenizer once cut U+0085 / U+2028 mid-character,
    # leaving b"a\xc2" (invalid UTF-8) as a word, which translate() could not
    # decode. Reference: Unicode's own categories (Zs, Zl, Zp) and NEL.
    import sys
    import unicodedata

    from keras_attention.models import text_processing

    spaces = [
        chr(c)
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp")
    ] + ["\x85"]
    texts = [f"ab{c}cd" for c in spaces]
    encoder = text_processing.TextEncoder(
        list(text_processing.RESERVED_TOKENS) + ["ab", "cd", "##d", "c"], split, lowercase
    )
    for text, tokens in zip(texts, encoder.tokenize(texts).to_list(), strict=True):
        words = [t.decode("utf-8") for t in tokens]  # valid UTF-8
        assert words in (["ab", "cd"], ["ab", "c", "##d"]), (text, words)


def test_vocabulary_counts_tokens_most_frequent_first():
    from keras_attention.models.text_processing import RESERVED_TOKENS
    from keras_attention.models.text_processing import build_vocabulary

    texts = ["abca", "cab", "dd", "a"]
    counts = collections.Counter("".join(texts))
    vocabulary = build_vocabulary(texts, "character")
    assert vocabulary[:4] == list(RESERVED_TOKENS)
    assert sorted(vocabulary[4:]) == sorted(counts)
    frequencies = [counts[t] for t in vocabulary[4:]]
    assert frequencies == sorted(frequencies, reverse=True)
    assert build_vocabulary(texts, "character", min_count=2)[4:] == ["a", "b", "c", "d"]
    assert len(build_vocabulary(texts, "character", max_tokens=5)) == 5


def test_encode_pads_truncates_and_maps_unknown_tokens():
    from keras_attention.models.text_processing import TextEncoder

    encoder = TextEncoder(
        ["<pad>", "<unk>", "<start>", "<end>", "a", "b"], split="character", max_length=4
    )
    ids, tokens = encoder.encode(["ab", "abzba!", ""])
    assert ids.numpy().tolist() == [[4, 5, 0, 0], [4, 5, 1, 5], [0, 0, 0, 0]]
    assert _strings(tokens)[1] == ["a", "b", "z", "b"]
    with_end, _ = encoder.encode(["abab"], add_end=True)
    assert with_end.numpy().tolist() == [[4, 5, 4, 3]]
    strings = encoder.ids_to_tokens(ids[:1, :2])
    assert encoder.join(strings).numpy().tolist() == [b"ab"]


def test_encoder_errors():
    from keras_attention.models.text_processing import TextEncoder

    with pytest.raises(ValueError, match="reserved"):
        TextEncoder(["a", "b"])
    with pytest.raises(ValueError, match="split"):
        TextEncoder(["<pad>", "<unk>", "<start>", "<end>"], split="bpe")
    with pytest.raises(ValueError, match="max_length"):
        TextEncoder(["<pad>", "<unk>", "<start>", "<end>"], max_length=0)
    with pytest.raises(ValueError, match="duplicate"):
        TextEncoder(["<pad>", "<unk>", "<start>", "<end>", "a", "a"])


def test_wordpiece_vocabulary_and_encoding_in_the_graph():
    from keras_attention.models.text_processing import TextEncoder
    from keras_attention.models.text_processing import build_vocabulary

    texts = ["le chat noir", "la souris grise", "les chats noirs", "une brise"]
    vocabulary = build_vocabulary(texts, "wordpiece")
    assert vocabulary[:4] == ["<pad>", "<unk>", "<start>", "<end>"]
    assert {"chat", "##s", "s", "grise"} <= set(vocabulary)
    assert "##se" in vocabulary and "##at" not in vocabulary  # shared endings only
    encoder = TextEncoder(vocabulary, "wordpiece", max_length=8)
    ids, tokens = encoder.encode(["Les souris grises", "chat ü"])
    assert [[t.decode() for t in row] for row in tokens.to_list()] == [
        ["les", "souris", "grise", "##s"],
        ["chat", "<unk>"],
    ]
    assert ids.shape == (2, 8) and ids.numpy()[1, 1] == 1  # <unk>
    assert encoder.join(tokens).numpy().tolist() == [b"les souris grises", b"chat <unk>"]
    assert len(build_vocabulary(texts, "wordpiece", max_tokens=10)) == 10
