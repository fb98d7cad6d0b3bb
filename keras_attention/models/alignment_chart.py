"""Plain-text and HTML views of a translation's alignment (no dependencies)."""

import html

import numpy as np

from keras_attention import validation

__all__ = ["alignment_matrix", "merge_subwords", "alignment_text", "alignment_html"]

_SHADES = " .:-=+*#%@"


def _check_translation(owner, argument, translation):
    """Raises unless `translation` looks like a `Translation` (text, tokens,
    source tokens and an alignment)."""
    needed = ("text", "tokens", "source_tokens", "alignment")
    if not all(hasattr(translation, name) for name in needed):
        raise TypeError(
            f"{owner}: `{argument}` must be a Translation (what `translate` returns). "
            f"Received: {argument}={translation!r}"
        )


def _shown(token):
    return "␣" if token == " " else token


def alignment_matrix(alignment, layer=-1, head=None):
    """The `(T_out, T_in)` matrix to draw from a translation's alignment.

    Args:
        alignment: `(T_out, T_in)` (`Seq2SeqTranslator`) or
            `(layers, heads, T_out, T_in)` (`TransformerTranslator`).
        layer, head: for a 4-D alignment, the index to show, or None to
            average over that axis. Default: the last layer, heads averaged.
    """
    for name, index in (("layer", layer), ("head", head)):
        if index is not None and not validation.is_int(index):
            raise TypeError(
                f"alignment_matrix: `{name}` must be an integer or None. Received: {name}={index!r}"
            )
    try:
        if isinstance(alignment, (str, bytes)) or alignment is None:
            raise TypeError
        alignment = np.asarray(alignment, dtype="float32")
    except (TypeError, ValueError):
        raise TypeError(
            "alignment_matrix: `alignment` must be an array of numbers. "
            f"Received: alignment={alignment!r}"
        ) from None
    if alignment.ndim == 4:
        for axis, index, name in ((1, head, "head"), (0, layer, "layer")):
            if index is None:
                alignment = alignment.mean(axis=axis)
                continue
            if not -alignment.shape[axis] <= index < alignment.shape[axis]:
                raise ValueError(
                    f"alignment_matrix: `{name}` must index one of the "
                    f"{alignment.shape[axis]} {name}s or be None. "
                    f"Received: {name}={index!r}"
                )
            alignment = np.take(alignment, index, axis=axis)
    if alignment.ndim != 2:
        raise ValueError(
            "alignment_matrix: expects a (T_out, T_in) or (layers, heads, "
            f"T_out, T_in) alignment. Received: alignment with shape "
            f"{alignment.shape}"
        )
    return alignment


def _word_groups(tokens, suffix):
    """Index lists of the tokens that make each word (`##` joins the previous)."""
    groups = []
    for index, token in enumerate(tokens):
        if groups and token.startswith(suffix):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def merge_subwords(translation, suffix="##"):
    """The translation with WordPiece tokens merged into words, for charts.

    A source word's column is the sum of its pieces' columns (rows stay
    distributions); an output word's row is the mean of its pieces' rows.
    Works on `(T_out, T_in)` and `(layers, heads, T_out, T_in)` alignments.
    """
    from keras_attention.models.decoding import Translation

    _check_translation("merge_subwords", "translation", translation)
    if not isinstance(suffix, str) or not suffix:
        raise ValueError(
            "merge_subwords: `suffix` must be a non-empty string (every token starts "
            f"with ''). Received: suffix={suffix!r}"
        )
    alignment = np.asarray(translation.alignment, dtype="float32")
    sources = _word_groups(translation.source_tokens, suffix)
    targets = _word_groups(translation.tokens, suffix)

    def word(tokens, group):
        return "".join(
            tokens[i].removeprefix(suffix) if n else tokens[i] for n, i in enumerate(group)
        )

    columns = np.stack([alignment[..., g].sum(-1) for g in sources], -1) if sources else alignment
    rows = np.stack([columns[..., g, :].mean(-2) for g in targets], -2) if targets else columns
    return Translation(
        text=translation.text,
        tokens=[word(translation.tokens, g) for g in targets],
        source_tokens=[word(translation.source_tokens, g) for g in sources],
        score=translation.score,
        alignment=rows,
    )


def alignment_text(translation, width=None, layer=-1, head=None):
    """A text chart: one line per output token, one column per source token.

    Each cell is a shade from `" .:-=+*#%@"` (darker = more attention); the
    line ends with the source token the output token attends to most. A
    Transformer's `(layers, heads, T_out, T_in)` alignment shows `layer`
    and `head` (None averages; see `alignment_matrix`).
    """
    _check_translation("alignment_text", "translation", translation)
    width = validation.validate_positive_int("alignment_text", "width", width, allow_none=True)
    alignment = alignment_matrix(translation.alignment, layer, head)
    source = [_shown(t) for t in translation.source_tokens]
    if width is None:
        width = max([1] + [len(t) for t in source])
        width += 1 if width > 1 else 0  # a space between multi-character tokens
    label = max([1] + [len(_shown(t)) for t in translation.tokens])
    header = " " * (label + 3) + "".join(t[:width].ljust(width) for t in source)
    lines = [header]
    for token, row in zip(translation.tokens, alignment, strict=False):
        cells = "".join(_SHADES[min(len(_SHADES) - 1, int(w * len(_SHADES)))] * width for w in row)
        top = source[int(np.argmax(row))] if len(row) else ""
        lines.append(f"{_shown(token).rjust(label)} | {cells}  <- {top}")
    return "\n".join(lines)


def alignment_html(translations, title="Attention alignments", layer=-1, head=None):
    """A self-contained HTML page with one heatmap table per translation.

    Cell darkness is the attention weight; hovering a cell shows the value.
    No scripts, no external resources. `layer` and `head` pick what a 4-D
    alignment shows, as in `alignment_text`.
    """
    if not isinstance(translations, (list, tuple)):
        raise TypeError(
            "alignment_html: `translations` must be a list of Translations. "
            f"Received: translations={translations!r}"
        )
    for index, translation in enumerate(translations):
        _check_translation("alignment_html", f"translations[{index}]", translation)
    if not isinstance(title, str):
        raise TypeError(f"alignment_html: `title` must be a string. Received: title={title!r}")
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}"
        "table{border-collapse:collapse;margin:0 0 2em 0}"
        "td,th{width:1.6em;height:1.6em;text-align:center;font-family:monospace;"
        "font-size:13px;padding:0}"
        "th.row{text-align:right;padding-right:.4em}"
        "caption{text-align:left;font-weight:bold;padding:.4em 0}</style>",
        f"</head><body><h1>{html.escape(title)}</h1>",
        "<p>Rows: output tokens. Columns: source tokens. Darker cells: more "
        "attention when the row's token was emitted.</p>",
    ]
    for translation in translations:
        alignment = alignment_matrix(translation.alignment, layer, head)
        source = "".join(translation.source_tokens)
        parts.append(
            "<table><caption>"
            f"{html.escape(source)} &rarr; {html.escape(translation.text)}"
            "</caption><tr><th></th>"
        )
        parts.extend(f"<th>{html.escape(_shown(t))}</th>" for t in translation.source_tokens)
        parts.append("</tr>")
        for token, row in zip(translation.tokens, alignment, strict=False):
            parts.append(f'<tr><th class="row">{html.escape(_shown(token))}</th>')
            for weight in row:
                level = int(round(255 * (1.0 - float(weight))))
                text_color = "#fff" if weight > 0.5 else "#000"
                parts.append(
                    f'<td title="{weight:.3f}" style="background:rgb({level},'
                    f'{level},255);color:{text_color}"></td>'
                )
            parts.append("</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
