"""griffe extension for our Keras-style docstrings.

Doctest examples (`>>>` lines and their output) are fenced as code, so that
Markdown does not read `x[0]` in them as a link.

Grouped arguments, `a, b: description`:

Our docstrings (like Keras') document related arguments together, sometimes
over several lines (`kernel_initializer, bias_initializer,` then more names).
Google-style parsing wants one name per item, so this rewrites each grouped
item into one item per name, all with the same description, before griffe
parses it. Unknown-argument checks then still catch a documented name that
the signature lacks.
"""

import re

import griffe

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Call arguments|Attributes):\s*$")
_NAMES = r"\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*"


def split_grouped_arguments(text):
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        match = _SECTION.match(line)
        i += 1
        if not match:
            continue
        base = len(match.group(1))
        while i < len(lines) and (not lines[i].strip()
                                  or len(lines[i]) - len(lines[i].lstrip()) > base):
            item = lines[i]
            indent = item[: len(item) - len(item.lstrip())]
            header = item.strip()
            # Names continued on the next lines: "a, b,\n    c: description".
            while re.fullmatch(_NAMES + r"\s*,", header) and i + 1 < len(lines):
                i += 1
                header = f"{header} {lines[i].strip()}"
            grouped = re.fullmatch(rf"({_NAMES})\s*:\s*(.*)", header)
            if grouped and "," in grouped.group(1):
                for name in re.split(r"\s*,\s*", grouped.group(1)):
                    out.append(f"{indent}{name}: {grouped.group(2)}")
            else:
                out.append(item if header == item.strip() else f"{indent}{header}")
            i += 1
    return "\n".join(out)


def fence_doctests(text):
    lines = text.split("\n")
    out, i, fenced = [], 0, False
    while i < len(lines):
        stripped = lines[i].lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        if not fenced and stripped.startswith(">>>"):
            indent = lines[i][: len(lines[i]) - len(stripped)]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


class KerasStyleDocstrings(griffe.Extension):
    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(split_grouped_arguments(obj.docstring.value))
