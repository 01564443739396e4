"""What a settings dataclass says about itself in its source: the comment above each field and
the class's docstring. The comments are the keys' documentation (they sit where a change to a
default is made), so docs/config.md reads them from there instead of keeping a second copy.

A field's description is the run of `#` lines right above it. One comment may cover a run of
consecutive fields (no blank line between them): a field with no comment of its own takes the
description of the field on the line above it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize


def _class_node(cls: type) -> tuple[ast.ClassDef, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef), cls
    return node, source


def _comment_lines(source: str) -> dict[int, str]:
    """Line number -> text of every line that holds only a comment."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _comment_above(line: int, comments: dict[int, str]) -> str:
    """The comment lines right above `line`, joined into one paragraph ('' when none)."""
    block = []
    above = line - 1
    while above in comments:
        block.append(comments[above])
        above -= 1
    return " ".join(text for text in reversed(block) if text)


def _own_field_comments(cls: type) -> dict[str, str]:
    """Field name -> description, for the fields this class's own body declares."""
    node, source = _class_node(cls)
    comments = _comment_lines(source)
    described: dict[str, str] = {}
    previous: tuple[int, str] = (-1, "")  # (last line, description) of the field above
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        text = _comment_above(statement.lineno, comments)
        if not text and previous[0] == statement.lineno - 1:
            text = previous[1]
        described[statement.target.id] = text
        previous = (statement.end_lineno or statement.lineno, text)
    return described


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> description for every field of a dataclass, its bases' fields included
    (a subclass's comment wins for a field it declares again)."""
    merged: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not object:
            merged.update(_own_field_comments(klass))
    return merged


def class_intro(cls: type) -> str:
    """The class's own docstring as one paragraph ('' when it has none: a dataclass without a
    docstring is given its signature as __doc__, which is no intro)."""
    node, _ = _class_node(cls)
    docstring = ast.get_docstring(node) or ""
    return " ".join(docstring.split())
