"""The Redis tier: one server or a Redis Cluster (``tier``); connections, slots and
redirects (``conn``); one deadline over every node's replies (``each``); URLs, passwords and
options (``options``)."""
