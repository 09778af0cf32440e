"""Reading the sum tree's slot maps (lua/_tree.lua) back in tests."""

from __future__ import annotations

from typing import Any

from redisbuf import BufferKeys

BUCKET, ID_WIDTH, SLOT_WIDTH = 16, 12, 10  # as in lua/_tree.lua


def _bucket_entries(raw: dict[bytes, bytes], width: int) -> dict[int, int]:
    out = {}
    for field, value in raw.items():
        text = value.decode()
        assert len(text) == BUCKET * width, f"bucket {field!r} has length {len(text)}"
        assert text.strip(), f"bucket {field!r} is blank but stored"
        for k in range(BUCKET):
            entry = text[k * width : (k + 1) * width]
            if entry.strip():
                out[BUCKET * int(field) + k] = int(entry)
    return out


def tree_maps(client: Any, name: str) -> tuple[dict[int, int], dict[int, int]]:
    """(slot -> item id, item id -> slot) as stored in tree:ids and tree:slots."""
    keys = BufferKeys(name)
    slot_to_id = _bucket_entries(client.hgetall(keys.tree_ids), ID_WIDTH)
    id_to_slot = _bucket_entries(client.hgetall(keys.tree_slots), SLOT_WIDTH)
    return slot_to_id, id_to_slot
