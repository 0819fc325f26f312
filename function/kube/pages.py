"""A list of whole objects in pages bounded in bytes as well as in count.

The apiserver's chunking (``limit`` and ``continue``) bounds a page by the number of objects, so
500 Pods of 1.5 MB are 750 MB in one answer, parsed. A ``Pager`` asks for a few objects first,
then for as many as fit ``page_bytes`` at the size of the largest object seen so far (at most
``page_size``): memory holds one page of about ``page_bytes``, whatever the objects' size. What
the drift reconciler (``castslice control``) and ``castslice doctor`` list Pods with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from function.kube.client import Api, ApiError

FIRST_PAGE: Final = 16
"""Objects asked for by the first page, before their size is known."""
PAGE_BYTES: Final = 8 * 2**20
PAGE_SIZE: Final = 500
LIST_TIMEOUT: Final = 60.0


class Pager:
    """``next()`` returns the next page of ``path`` (a list of objects) until ``done``; raises
    ApiError (a 410 when the continue token expired: start a new Pager) or OSError."""

    def __init__(
        self,
        api: Api,
        path: str,
        query: Mapping[str, str] | None = None,
        *,
        page_size: int = PAGE_SIZE,
        page_bytes: int = PAGE_BYTES,
    ) -> None:
        self.api, self.path, self.query = api, path, dict(query or {})
        self.page_size, self.page_bytes = page_size, page_bytes
        self.token = ""
        self.largest = 0
        """Bytes of the largest object seen so far (as JSON)."""
        self.done = False
        self.pages = 0

    def limit(self) -> int:
        if not self.largest:
            return min(FIRST_PAGE, self.page_size)
        return max(1, min(self.page_size, self.page_bytes // self.largest))

    def next(self, timeout: float = LIST_TIMEOUT) -> list[dict[str, Any]]:
        query = {**self.query, "limit": str(self.limit())}
        if self.token:
            query["continue"] = self.token
        response = self.api.request("GET", self.path, query=query, timeout=timeout)
        if not response.ok:
            raise ApiError(f"GET {self.path}", response)
        items = [item for item in response.body.get("items") or () if isinstance(item, dict)]
        for item in items:
            self.largest = max(self.largest, len(orjson.dumps(item)))
        metadata = response.body.get("metadata")
        self.token = str(metadata.get("continue") or "") if isinstance(metadata, Mapping) else ""
        self.done = not self.token
        self.pages += 1
        return items
