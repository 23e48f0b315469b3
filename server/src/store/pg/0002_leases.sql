-- One owner per live session: the host that serves it holds its lease until `expires_at` (the
-- database's clock decides), and every take-over of an expired lease bumps `epoch`, which
-- fences the writes of the former holder (see `lease.rs`).
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    address TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
