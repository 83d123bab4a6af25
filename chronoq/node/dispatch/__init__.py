"""Dispatch: what a write did reaches whoever waits for it. The dispatcher, ready
wake-ups and notices between nodes, claims, the hand-off and the worker streams; the edge
and the owner engine both import it."""
