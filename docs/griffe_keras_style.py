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

Types, `name (type): description`:

Our code has few annotations and Keras-style docstrings give types in prose,
so an argument's type is shown where it is certain: its annotation, or else
the type of a literal default (`dropout=0.0` is a float, `use_bias=True` a
bool, `score="dot"` a str, `num_features=256` an int). Arguments without
either (`None` defaults, required arguments) show no type rather than a guess.
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
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > base
        ):
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


_LITERAL_TYPES = (
    (re.compile(r"^(True|False)$"), "bool"),
    (re.compile(r"^[+-]?\d+$"), "int"),
    (re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$"), "float"),
    (re.compile(r"^(\"[^\"]*\"|'[^']*')$"), "str"),
)


def parameter_types(function):
    """{name: type} for the parameters whose type is certain (see the module doc)."""
    types = {}
    for parameter in getattr(function, "parameters", ()):
        if parameter.annotation is not None:
            types[parameter.name] = str(parameter.annotation)
            continue
        default = None if parameter.default is None else str(parameter.default)
        for pattern, name in _LITERAL_TYPES:
            if default is not None and pattern.match(default):
                types[parameter.name] = name
                break
    return types


def add_types(text, types):
    """`name: description` -> `name (type): description` in the Args sections."""
    if not types:
        return text
    lines, section = text.split("\n"), None
    for index, line in enumerate(lines):
        match = _SECTION.match(line)
        if match:
            section = len(match.group(1))
            continue
        if section is None:
            continue
        if line.strip() and len(line) - len(line.lstrip()) <= section:
            section = None
            continue
        item = re.match(r"^(\s+)(\w+):(\s|$)", line)
        if item and item.group(2) in types and len(item.group(1)) - section <= 4:
            lines[index] = line.replace(
                f"{item.group(2)}:", f"{item.group(2)} ({types[item.group(2)]}):", 1
            )
    return "\n".join(lines)


class KerasStyleDocstrings(griffe.Extension):
    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(split_grouped_arguments(obj.docstring.value))

    def _add_types(self, obj, function):
        if obj.docstring is not None and function is not None and function.is_function:
            obj.docstring.value = add_types(obj.docstring.value, parameter_types(function))

    def on_function(self, *, func, **kwargs):  # its parameters are known by now
        self._add_types(func, func)

    def on_class_members(self, *, cls, **kwargs):  # the constructor is a member by now
        self._add_types(cls, cls.members.get("__init__"))
