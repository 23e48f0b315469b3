-- A session's artifacts in the order they came, for a listing's page (`OFFSET`/`LIMIT` on `seq`)
-- without sorting every artifact of the session.
CREATE INDEX artifacts_by_session ON artifacts (session_id, seq);
