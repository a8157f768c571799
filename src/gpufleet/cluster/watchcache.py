"""A shared watch cache: the lists of every namespace (and of cluster-scoped kinds) that the
dashboard's pages make, each served from memory and kept current by a watch, so that a page's
refresh, whoever asks, costs the API server nothing (issue 53, item 6).

Why this is written here: client-go's informers (a reflector: list, then watch from the list's
resourceVersion, list again when the watch's version has expired, 410 Gone) have no equivalent
in the Python client, which offers the watch stream (kubernetes.watch.Watch, used below) but no
store. This is that reflector, kept small: one store per distinct list call, filled by the same
call the page would make (so the same selectors and the same errors), and read as the call's
answer (``{"items": [...]}``).

``Cached(api)`` wraps a client (CustomObjectsApi, or gpufleet's BuiltinApi): its
``list_cluster_custom_object``, ``list_*_for_all_namespaces`` and ``list_node`` come from the
cache; every other method (a job's own objects, logs, namespaced lists) goes to the API server.
A store that is listing again, or whose last list or watch failed, is not trusted: the call is
made directly until it has listed again. (A quiet kind sends no events for minutes: silence is
no sign of a lost watch. A dead connection ends the watch at its request timeout.)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from gpufleet.cluster.access import as_dict
from gpufleet.cluster.apierrors import status_code
from gpufleet.kube import Obj

CACHED = re.compile(r"^list_(cluster_custom_object|\w+_for_all_namespaces|node)$")
WATCH_S = 240  # a watch's server-side timeout; it resumes from the last version it saw
RETRY_S = (2.0, 60.0)  # after a failed list or watch, the first wait, doubled up to the last
FIRST_LIST_S = 30.0  # longest a page waits for a new store's first list


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class Store:
    """One list call's objects, listed once and then followed by watch events."""

    def __init__(
        self, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.call, self.args, self.kwargs = call, args, kwargs
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        self._version = ""
        self.listed = threading.Event()  # the first list is done (or failed: see error)
        self.error: BaseException | None = None  # the last failure, until the next success
        self.lists = 0  # how many times the objects were listed (1 while the watch holds)
        self._stop = threading.Event()

    def fresh(self) -> bool:
        return self.error is None and bool(self._version)  # listed, and not listing again

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """List, then watch; again after a watch ends (from its version) or fails (relist)."""
        wait = RETRY_S[0]
        while not self._stop.is_set():
            try:
                if not self._version:
                    self._list()
                wait = RETRY_S[0]
                self._watch()
            except Exception as exc:  # the thread must live on: any failure is kept, then retried
                self._version = ""  # list again: at once for an expired version (410 Gone)
                if status_code(exc) == 410:
                    continue
                self.error = exc  # a forbidden or missing kind: tried less and less often
                self.listed.set()
                self._stop.wait(wait)
                wait = min(wait * 2, RETRY_S[1])

    def _list(self) -> None:
        found = as_dict(self.call(*self.args, **self.kwargs))
        with self._lock:
            self._items = {_key(o): o for o in found.get("items") or []}
            self._version = str((found.get("metadata") or {}).get("resourceVersion") or "")
        self.lists += 1
        self.error = None
        self.listed.set()

    def _watch(self) -> None:
        from kubernetes.watch import Watch

        watch: Any = Watch()  # type: ignore[no-untyped-call]
        stream = watch.stream(self.call, *self.args, resource_version=self._version,
                              allow_watch_bookmarks=True, timeout_seconds=WATCH_S,
                              _request_timeout=WATCH_S + 30, **self.kwargs)  # fmt: skip
        for event in stream:
            obj = as_dict(event.get("raw_object") or event.get("object") or {})
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            with self._lock:
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._items[_key(obj)] = obj
                elif event["type"] == "DELETED":
                    self._items.pop(_key(obj), None)
                self._version = version or self._version
            if self._stop.is_set():
                watch.stop()
                return


class Cached:
    """``api``'s whole-cluster lists from shared stores (see the module's docstring)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._stores: dict[str, Store] = {}
        self._lock = threading.Lock()

    def __getattr__(self, method: str) -> Any:
        real = getattr(self.api, method)
        if not CACHED.match(method):
            return real

        def cached(*args: Any, **kwargs: Any) -> Any:
            return self._answer(method, real, args, kwargs)

        return cached

    def stores(self) -> list[Store]:
        with self._lock:
            return list(self._stores.values())

    def close(self) -> None:
        for store in self.stores():
            store.stop()

    def _answer(self, method: str, real: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = repr((method, args, sorted(kwargs.items())))
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = Store(real, args, kwargs)
                threading.Thread(target=store.run, name=f"watch {method}", daemon=True).start()
        store.listed.wait(FIRST_LIST_S)
        if store.fresh():
            return {"items": store.items()}
        # Not listed yet, or its watch is failing: the API server's own answer (or error), so
        # that a forbidden or missing kind reads as it does without the cache.
        return real(*args, **kwargs)
