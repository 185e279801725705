"""The YAML side of the sprint board: the `development_status` pairs, read from the event stream.

A board can hold tens of thousands of keys (13 MB has been seen), and the lane reads the target's
board on every tick. Building a node graph with PyYAML's pure-Python loader took about 15 s for
11 MB; so this module walks the *events* of libyaml's C parser (`yaml.CSafeLoader`, when PyYAML
was built with it; the pure-Python parser otherwise), keeps only the pairs of the top-level
`development_status` mapping and the top-level `story_location`, and resolves the tags of the
values only (memoised: a board has a handful of distinct statuses). The same 11 MB board reads in
well under a second.

It reads what `yaml.compose` would: a document that uses anchors or aliases (where an event is not
the whole story) is composed as nodes instead, with the same result. Positions are line numbers
and character offsets into the text (`Scalar.start`/`end`); libyaml does not count a leading
byte-order mark, so its offsets are moved on by one here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml
from yaml.events import (AliasEvent, CollectionStartEvent, DocumentStartEvent, MappingEndEvent,
                         MappingStartEvent, ScalarEvent, SequenceEndEvent, StreamEndEvent)
from yaml.nodes import MappingNode, ScalarNode

from ..errors import ConfigError

__all__ = ["BoardYaml", "Scalar", "read_board_yaml", "LOADER"]

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_BOM = "\ufeff"


class Scalar(NamedTuple):  # a tuple: a board makes two per key, and tuples are cheap
    """A key or value: a scalar (`value`, resolved `tag`, `style`), or (`scalar` False) a mapping
    or sequence, of which only the position is kept. `start`/`end` are offsets into the text."""

    scalar: bool
    value: str
    tag: str | None
    style: str | None
    line: int  # 1-based
    start: int
    end: int


@dataclass(frozen=True)
class BoardYaml:
    root_is_mapping: bool
    # The first top-level `development_status`: None when there is none; `status_is_mapping`
    # False when its value is not a mapping (then `pairs` is empty).
    status: Scalar | None
    status_is_mapping: bool
    pairs: tuple[tuple[Scalar, Scalar], ...]
    story_location: Scalar | None  # the first top-level `story_location` value, if any


class _NeedsNodes(Exception):
    """An anchor or alias: the events alone do not say what a value is."""


def yaml_error(exc: yaml.YAMLError, path: Path) -> ConfigError:
    where = ""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f" (line {mark.line + 1})"
    problem = getattr(exc, "problem", None) or type(exc).__name__
    return ConfigError(f"{path}: invalid YAML{where}: {problem}")


def read_board_yaml(text: str, path: Path, loader=None) -> BoardYaml:
    """The board's YAML as `BoardYaml`; invalid YAML is one `ConfigError` line with its line.
    `loader`: a PyYAML loader class to use instead of the fastest one there is."""
    loader = loader or LOADER
    offset = 1 if text.startswith(_BOM) and loader is not yaml.SafeLoader else 0
    try:
        try:
            return _Walk(text, offset, loader).board()
        except _NeedsNodes:
            return _from_nodes(yaml.compose(text, Loader=loader), offset)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, path) from None


class _Walk:
    def __init__(self, text: str, offset: int, loader):
        self.events = iter(yaml.parse(text, Loader=loader))
        self.offset = offset
        self.resolver = yaml.resolver.Resolver()
        self.tags: dict[tuple, str] = {}

    def next(self):
        event = next(self.events)
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _NeedsNodes
        return event

    def item(self, event, *, resolve: bool) -> Scalar:
        start, end = event.start_mark.index + self.offset, event.end_mark.index + self.offset
        line = event.start_mark.line + 1
        if not isinstance(event, ScalarEvent):
            self.skip(event)
            return Scalar(False, "", None, None, line, start, end)
        tag = event.tag
        if resolve and (tag is None or tag == "!"):
            key = (event.value, event.implicit)
            tag = self.tags.get(key)
            if tag is None:
                tag = self.tags[key] = self.resolver.resolve(ScalarNode, event.value, event.implicit)
        return Scalar(True, event.value, tag, event.style or None, line, start, end)

    def skip(self, event) -> None:
        """Consume the rest of the collection `event` opened (nothing for a scalar)."""
        depth = 1 if isinstance(event, CollectionStartEvent) else 0
        while depth:
            event = self.next()
            if isinstance(event, CollectionStartEvent):
                depth += 1
            elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
                depth -= 1

    def mapping(self):
        """(key, value event) pairs of the mapping whose start was just read; a key that is a
        collection is read to its end before its value's event is."""
        while not isinstance(event := self.next(), MappingEndEvent):
            key = self.item(event, resolve=False)
            yield key, self.next()

    def board(self) -> BoardYaml:
        self.next()  # StreamStart
        event = self.next()
        if isinstance(event, StreamEndEvent):  # an empty file: no document, like compose's None
            return BoardYaml(False, None, False, (), None)
        root = self.next()  # after DocumentStart
        status = location = None
        status_is_mapping, pairs = False, []
        if isinstance(root, MappingStartEvent):
            for key, value_event in self.mapping():
                if key.scalar and key.value == "development_status" and status is None:
                    status = key
                    status_is_mapping = isinstance(value_event, MappingStartEvent)
                    if status_is_mapping:
                        pairs = [(k, self.item(v, resolve=True)) for k, v in self.mapping()]
                    else:
                        self.skip(value_event)
                elif key.scalar and key.value == "story_location" and location is None:
                    location = self.item(value_event, resolve=True)
                else:
                    self.skip(value_event)
        else:
            self.skip(root)
        self.next()  # DocumentEnd
        event = self.next()
        if isinstance(event, DocumentStartEvent):
            raise yaml.composer.ComposerError("expected a single document in the stream", None,
                                              "but found another document", event.start_mark)
        return BoardYaml(isinstance(root, MappingStartEvent), status, status_is_mapping,
                         tuple(pairs), location)


def _node_item(node, offset: int) -> Scalar:
    start, end = node.start_mark.index + offset, node.end_mark.index + offset
    if isinstance(node, ScalarNode):
        return Scalar(True, node.value, node.tag, node.style or None, node.start_mark.line + 1,
                      start, end)
    return Scalar(False, "", None, None, node.start_mark.line + 1, start, end)


def _from_nodes(root, offset: int) -> BoardYaml:
    """The same reading from a composed node graph (documents with anchors or aliases)."""
    if not isinstance(root, MappingNode):
        return BoardYaml(False, None, False, (), None)
    status = location = None
    status_is_mapping, pairs = False, []
    for knode, vnode in root.value:
        if not isinstance(knode, ScalarNode):
            continue
        if knode.value == "development_status" and status is None:
            status = _node_item(knode, offset)
            status_is_mapping = isinstance(vnode, MappingNode)
            if status_is_mapping:
                pairs = [(_node_item(k, offset), _node_item(v, offset)) for k, v in vnode.value]
        elif knode.value == "story_location" and location is None:
            location = _node_item(vnode, offset)
    return BoardYaml(True, status, status_is_mapping, tuple(pairs), location)
