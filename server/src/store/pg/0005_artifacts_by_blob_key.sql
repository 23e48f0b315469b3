-- The rows that name a page of listed content (`blob_key = ANY(...)`), for the orphan sweep,
-- without reading every artifact's row.
CREATE INDEX artifacts_by_blob_key ON artifacts (blob_key);
