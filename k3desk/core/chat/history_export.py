"""Conversations exported: all branches as JSON, the current branch as Markdown."""

from __future__ import annotations

import base64
import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from k3desk.core.chat.records import HistoryError
from k3desk.core.private import FILE_MODE, private_dir, replacing, write_private
from k3desk.core.safepaths import display_name

if TYPE_CHECKING:
    from k3desk.core.chat.history import HistoryStore

EXPORT_FORMAT: Final = "k3desk-conversation"


def export_json(
    store: HistoryStore, conversation_id: int, *, embed_images: bool = False
) -> dict[str, Any]:
    """The whole conversation (every branch) as plain JSON-ready data."""
    conv, every, branch = store.snapshot(conversation_id)
    path = [m.id for m in branch]
    messages = []
    for m in every:
        item: dict[str, Any] = {
            "id": m.id,
            "parent_id": m.parent_id,
            "role": m.role,
            "content": m.content,
            "reasoning": m.reasoning,
            "created": iso(m.created),
            "partial": m.partial,
            "finish_reason": m.finish_reason,
            "model": m.model,
            "usage": m.usage.to_dict() if m.usage else None,
            "timings": m.timings.to_dict() if m.timings else None,
            "images": [],
        }
        for img in m.images:
            entry: dict[str, Any] = {
                "sha256": img.sha256,
                "mime": img.mime,
                "width": img.width,
                "height": img.height,
                "bytes": img.size,
                "name": img.name,
                "file": str(img.path),
            }
            if embed_images:
                entry["data"] = base64.b64encode(img.read_bytes()).decode("ascii")
            item["images"].append(entry)
        messages.append(item)
    return {
        "format": EXPORT_FORMAT,
        "version": 1,
        "conversation": {
            "id": conv.id,
            "title": conv.title,
            "created": iso(conv.created),
            "updated": iso(conv.updated),
            "system_prompt": conv.system_prompt,
            "settings": conv.settings.to_dict(),
            "tier": conv.tier,
            "model": conv.model,
        },
        "current_path": path,
        "messages": messages,
    }

def export_markdown(
    store: HistoryStore, conversation_id: int, *, assets_dir: Path | None = None
) -> str:
    """The current branch as Markdown.

    With ``assets_dir`` the images are copied there and linked by relative path
    (``assets_dir.name/<file>``); otherwise they link to the stored files.
    """
    conv, msgs = store.open_conversation(conversation_id)
    s = conv.settings
    out = [f"# {conv.title}", ""]
    facts = [f"Created {iso(conv.created)}"]
    if conv.model:
        facts.append(f"model {conv.model}")
    if conv.tier:
        facts.append(f"tier {conv.tier}")
    facts.append(
        f"temperature {s.temperature:g}, top_p {s.top_p:g}, "
        f"thinking {'on' if s.thinking else 'off'}"
        + (f" ({s.thinking_effort})" if s.thinking and s.thinking_effort else "")
    )
    out += [f"*{' · '.join(facts)}*", ""]
    if conv.system_prompt:
        out += ["## System", "", conv.system_prompt, ""]
    if assets_dir is not None:
        private_dir(assets_dir)
    for m in msgs:
        out += [f"## {m.role.capitalize()}", ""]
        for i, img in enumerate(m.images, 1):
            if assets_dir is not None:
                # the stored file's own name (its hash and extension), never the name
                # the picture had when it was attached
                target = assets_dir / img.path.name
                if not target.exists():
                    write_private(target, img.read_bytes())
                link = f"{assets_dir.name}/{img.path.name}"
            else:
                link = img.path.as_uri()
            out += [f"![{md_label(img.name) or f'image {i}'}]({link})", ""]
        if m.reasoning:
            out += [
                "<details><summary>Reasoning</summary>",
                "",
                m.reasoning,
                "",
                "</details>",
                "",
            ]
        if m.content:
            out += [m.content, ""]
        if m.partial:
            out += ["*(partial answer: the engine stopped before finishing it)*", ""]
    return "\n".join(out).rstrip() + "\n"

def write_export(
    store: HistoryStore, conversation_id: int, target: Path, *, fmt: str = "md"
) -> Path:
    """Write the conversation to ``target`` as ``md`` (with an assets folder) or ``json``."""
    target = Path(target)
    if fmt == "json":
        text = json.dumps(export_json(store, conversation_id, embed_images=True), indent=2)
    elif fmt == "md":
        assets = target.with_name(target.stem + "_files")
        text = export_markdown(store, conversation_id, assets_dir=assets)
        with contextlib.suppress(OSError):
            assets.rmdir()  # no images: leave no empty folder
    else:
        raise HistoryError(f"Unknown export format {fmt!r}; use md or json.")
    try:
        _write_export_file(target, text)
    except OSError as exc:
        raise HistoryError(
            f"Cannot write the export {target}: {exc.strerror or exc}.",
            "Choose a folder you can write to.",
        ) from None
    return target


def md_label(name: str) -> str:
    """An image's name as Markdown link text (no line breaks, brackets escaped)."""
    text = display_name(name)
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _write_export_file(target: Path, text: str) -> None:
    """The export, 0600 (a copy of private conversations: private too), replacing
    ``target`` atomically.  A folder k3desk makes for it is 0700; a folder the person
    chose and that exists (their Documents) keeps its permissions: an export never
    changes who may read the person's other files."""
    if not target.parent.exists():
        private_dir(target.parent)
    with replacing(target, FILE_MODE) as f:
        f.write(text.encode("utf-8"))
