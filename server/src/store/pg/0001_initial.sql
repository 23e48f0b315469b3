-- Version 1: every record the filesystem store keeps, as rows. Times are RFC 3339 text, as the
-- traits carry them (they sort as text, as the filesystem store sorts them); JSON records are
-- kept as the text the filesystem store writes, so both stores read the same words.

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT,
    created_at TEXT NOT NULL,
    last_active TEXT NOT NULL,
    provider TEXT,
    model TEXT,
    -- The conversation's frontmatter (what `session.md` starts with).
    history_created_at TEXT NOT NULL,
    history_provider TEXT,
    history_model TEXT,
    -- The per-session settings (`config.toml` of the filesystem store), set by the operator.
    config TEXT
);
CREATE INDEX sessions_by_owner ON sessions (owner, last_active DESC, id);

CREATE TABLE messages (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX messages_by_session ON messages (session_id, seq);

CREATE TABLE audit (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    record TEXT NOT NULL
);
CREATE INDEX audit_by_session ON audit (session_id, seq);

CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    user_name TEXT NOT NULL,
    device_id TEXT NOT NULL,
    path TEXT NOT NULL,
    uri TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_active TEXT NOT NULL,
    -- True for a folder resolved by (user, device, path); false for a record added whole (a
    -- `general` workspace of the workspace service API, which has no path).
    resolved BOOLEAN NOT NULL
);
-- The idempotent resolve: one record per (user, device, path), whoever asks at the same time.
CREATE UNIQUE INDEX workspaces_resolve ON workspaces (user_name, device_id, path) WHERE resolved;
CREATE INDEX workspaces_by_user ON workspaces (user_name, last_active DESC, id);

CREATE TABLE workspace_sessions (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    session_id TEXT NOT NULL,
    first_at TEXT NOT NULL,
    last_active TEXT NOT NULL,
    calls BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, session_id)
);
CREATE INDEX workspace_sessions_by_session ON workspace_sessions (session_id);

CREATE TABLE bindings (
    user_name TEXT NOT NULL,
    device_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    used BIGINT NOT NULL,
    PRIMARY KEY (user_name, device_id)
);
CREATE INDEX bindings_by_session ON bindings (session_id);

CREATE TABLE defaults (
    user_name TEXT PRIMARY KEY,
    session_id TEXT NOT NULL
);

CREATE TABLE folder_sessions (
    user_name TEXT NOT NULL,
    device_id TEXT NOT NULL,
    folder TEXT NOT NULL,
    active TEXT NOT NULL,
    -- Session id -> last use (Unix ms), as a JSON object.
    sessions TEXT NOT NULL,
    PRIMARY KEY (user_name, device_id, folder)
);

CREATE TABLE artifacts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    -- The artifact's metadata as JSON (`ArtifactMeta`).
    meta TEXT NOT NULL,
    -- Where its content is in the blob store.
    blob_key TEXT NOT NULL,
    UNIQUE (session_id, id)
);

CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    user_name TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL
);
