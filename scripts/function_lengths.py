#!/usr/bin/env python3
"""Lists the functions in C++/CUDA sources longer than a limit (DESIGN.md: a function fits on a screen).

    scripts/function_lengths.py [--max 80] [paths...]     (default: src/ and tools/)

A function's length is the lines from its opening brace to its closing one. The scan strips comments, string and
character literals, then follows the braces: a brace opens a function body when the text before it, since the
previous statement, ends in a parameter list (optionally followed by qualifiers, a trailing return type or a
constructor's initialiser list) and it sits at namespace or class scope. Lambdas and blocks inside a function
count as part of it. Exit status 1 when any function is over the limit, so CI can run it.
"""
import argparse
import pathlib
import re
import sys

SOURCE_SUFFIXES = {".cpp", ".h", ".cu", ".cuh", ".hpp", ".cc"}
SCOPE_KEYWORDS = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$")
FUNCTION_TAIL = re.compile(
    r"\)\s*(const|noexcept(\([^)]*\))?|override|final|mutable|&|&&|->\s*[\w:<>,\s*&]+|\s)*"
    r"(:\s*[\w:]+\s*[({].*)?$", re.S)


def strip(text: str) -> str:
    """Comments, strings and character literals blanked out, newlines kept (so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(path: pathlib.Path, limit: int):
    text = strip(path.read_text(errors="replace"))
    stack = []  # (kind, start line, signature)
    statement_start = 0
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == ";":
            statement_start = i + 1
        elif c == "{":
            before = text[statement_start:i]
            head = re.sub(r"\s+", " ", before).strip()
            enclosing = stack[-1][0] if stack else "scope"
            if enclosing in ("scope",) and SCOPE_KEYWORDS.search(head.split("(")[0] if "(" in head else head):
                kind = "scope"
            elif enclosing == "scope" and FUNCTION_TAIL.search(head) and "=" not in head.split("(")[0]:
                kind = "function"
            else:
                kind = "block"
            stack.append((kind, line, head))
            statement_start = i + 1
        elif c == "}":
            if stack:
                kind, start, head = stack.pop()
                if kind == "function" and line - start + 1 > limit:
                    yield start, line - start + 1, head[-100:]
            statement_start = i + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=80)
    parser.add_argument("paths", nargs="*", default=["src", "tools"])
    args = parser.parse_args()
    found = 0
    for root in args.paths:
        root_path = pathlib.Path(root)
        files = [root_path] if root_path.is_file() else sorted(root_path.rglob("*"))
        for f in files:
            if f.suffix not in SOURCE_SUFFIXES or not f.is_file():
                continue
            for start, length, head in long_functions(f, args.max):
                print(f"{f}:{start}: {length} lines: {head}")
                found += 1
    if found:
        print(f"{found} function(s) over {args.max} lines", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
