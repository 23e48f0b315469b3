//! Artifact content, by key, behind one small trait: the PostgreSQL store keeps the index in rows
//! and the content here. Keys are `{workspaceId or sessionId}/{artifactId}` (seed 004's object
//! keys), so an object store (S3) implements the same trait with the same keys.
//!
//! A `put` returns once the content is durable: the caller writes the row that names it only
//! after.

use std::path::{Path, PathBuf};

use super::StoreError;
use crate::fsutil::{PRIVATE_FILE, create_private_dir, write_atomic};

/// Content by key.
pub trait Blobs: Send + Sync {
    /// Stores `bytes` under `key`, replacing what was there; durable when this returns.
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError>;
    /// The content under `key`; `None` when there is none.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Removes the content under `key` (none there is not an error).
    fn delete(&self, key: &str) -> Result<(), StoreError>;
}

/// Blobs as files: `<root>/<scope>/<artifact>`, written atomically (write, fsync, rename, fsync
/// the directory).
#[derive(Debug, Clone)]
pub struct FsBlobs {
    root: PathBuf,
}

impl FsBlobs {
    /// Blobs under `root` (created as needed), e.g. `<data_dir>/blobs`.
    pub fn new(root: &Path) -> FsBlobs {
        FsBlobs {
            root: root.to_path_buf(),
        }
    }

    /// The file of `key`: exactly two parts, each letters, digits, `-` and `_`, so a key never
    /// names anything outside the root.
    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        let part = |p: &str| {
            !p.is_empty()
                && p.len() <= 64
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        match key.split_once('/') {
            Some((scope, id)) if part(scope) && part(id) => Ok(self.root.join(scope).join(id)),
            _ => Err(StoreError::Invalid(format!("`{key}` is not a blob key"))),
        }
    }
}

impl Blobs for FsBlobs {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let dir = path.parent().expect("a key has a scope");
        create_private_dir(dir).map_err(|e| StoreError::io("create", dir, e))?;
        write_atomic(&path, bytes, PRIVATE_FILE).map_err(|e| StoreError::Io {
            op: "write",
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key)?;
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("read", &path, e)),
        }
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("delete", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_keys_cannot_leave_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = FsBlobs::new(&dir.path().join("blobs"));
        blobs.put("s1/a1", b"content").unwrap();
        assert_eq!(
            blobs.get("s1/a1").unwrap().as_deref(),
            Some(&b"content"[..])
        );
        blobs.put("s1/a1", b"new").unwrap();
        assert_eq!(blobs.get("s1/a1").unwrap().as_deref(), Some(&b"new"[..]));
        blobs.delete("s1/a1").unwrap();
        blobs.delete("s1/a1").unwrap();
        assert_eq!(blobs.get("s1/a1").unwrap(), None);
        for bad in [
            "../x/y",
            "a/../../b",
            "a",
            "a/b/c",
            "/a/b",
            "a/",
            "/b",
            "a/..",
        ] {
            assert!(blobs.put(bad, b"x").is_err(), "{bad}");
            assert!(blobs.get(bad).is_err(), "{bad}");
        }
        assert!(!dir.path().join("x").exists());
    }
}
