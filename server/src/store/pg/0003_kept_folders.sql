-- A session's attached folders and its focus, as JSON (`{"focus": ..., "folders": [...]}`), so
-- that a folder whose attach stopped stays in the session, offline, when the session is loaded
-- again (another host, a restart). NULL: none.
ALTER TABLE sessions ADD COLUMN kept TEXT;
