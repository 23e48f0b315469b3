//! Artifact content, by key, behind one small trait: the PostgreSQL store keeps the index in rows
//! and the content here. Keys are `{sessionId}/{artifactId}`, or `{workspaceId}/{sessionId}.
//! {artifactId}` for an upload to a workspace (seed 004's `{workspaceId}/{artifactId}`, with the
//! artifact's public id), so an object store (S3) implements the same trait with the same keys.
//!
//! A `put` returns once the content is durable: the caller writes the row that names it only
//! after. So a crash between the two leaves content that no row names (an orphan), never a row
//! naming nothing; [`orphans`] decides which listed content the sweep removes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

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
    /// Every key held, with when its content was last written (for the orphan sweep).
    fn list(&self) -> Result<Vec<BlobEntry>, StoreError>;
}

/// One key a blob store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobEntry {
    /// `{scope}/{artifact}`.
    pub key: String,
    /// When its content was last written.
    pub modified: SystemTime,
}

/// The keys of `listed` that the sweep removes: those no row names (`named`) and written at
/// least `grace` before `now`, so content whose row is still being written (a put in flight)
/// is never taken. Content written "in the future" (a clock step) is kept.
pub fn orphans(
    listed: &[BlobEntry],
    named: &HashSet<String>,
    now: SystemTime,
    grace: Duration,
) -> Vec<String> {
    listed
        .iter()
        .filter(|e| !named.contains(&e.key))
        .filter(|e| now.duration_since(e.modified).is_ok_and(|age| age >= grace))
        .map(|e| e.key.clone())
        .collect()
}

/// What one sweep found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Keys the blob store holds.
    pub listed: usize,
    /// Orphans removed.
    pub removed: usize,
}

/// Checks a blob key: exactly two parts, each 1 to 160 letters, digits, `-`, `_` and `.`, not
/// starting with `.` (so never `.` or `..`, nor a temporary file of a write in flight), so a key
/// never names anything outside its root (a directory, a bucket prefix).
pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 160
            && !p.starts_with('.')
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match key.split_once('/') {
        Some((scope, id)) if part(scope) && part(id) => Ok(()),
        _ => Err(StoreError::Invalid(format!("`{key}` is not a blob key"))),
    }
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

    /// The file of `key`: exactly two parts, checked as [`check_key`] does, so a key never names
    /// anything outside the root.
    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(key)?;
        let (scope, id) = key.split_once('/').expect("a checked key has two parts");
        Ok(self.root.join(scope).join(id))
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

    fn list(&self) -> Result<Vec<BlobEntry>, StoreError> {
        let entries = |dir: &Path| match std::fs::read_dir(dir) {
            Ok(entries) => Ok(Some(entries)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("list", dir, e)),
        };
        let mut out = Vec::new();
        let Some(scopes) = entries(&self.root)? else {
            return Ok(out);
        };
        for scope in scopes.flatten() {
            // A stray file beside the scopes is no scope (its listing failed, and with it every
            // sweep after).
            if !scope.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Some(files) = entries(&scope.path())? else {
                continue;
            };
            for file in files.flatten() {
                let key = format!(
                    "{}/{}",
                    scope.file_name().to_string_lossy(),
                    file.file_name().to_string_lossy()
                );
                // Temporary files of a write in flight, and anything else, are no key.
                if check_key(&key).is_err() {
                    continue;
                }
                let Ok(meta) = file.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let modified = meta
                    .modified()
                    .map_err(|e| StoreError::io("stat", &file.path(), e))?;
                out.push(BlobEntry { key, modified });
            }
        }
        Ok(out)
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
            "a/.",
            "../b",
            ".a/b",
            "a/.b",
        ] {
            assert!(blobs.put(bad, b"x").is_err(), "{bad}");
            assert!(blobs.get(bad).is_err(), "{bad}");
        }
        assert!(!dir.path().join("x").exists());
    }

    #[test]
    fn blobs_are_listed_by_key_and_stray_files_are_not_keys() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let blobs = FsBlobs::new(&root);
        assert_eq!(blobs.list().unwrap(), []);
        blobs.put("s1/a1", b"1").unwrap();
        blobs.put("w1/a2", b"2").unwrap();
        std::fs::write(root.join("s1/.a3.tmp"), b"partial").unwrap();
        // A stray file beside the scopes (its listing failed the whole list before).
        std::fs::write(root.join("notes.txt"), b"stray").unwrap();
        let mut keys: Vec<String> = blobs.list().unwrap().into_iter().map(|e| e.key).collect();
        keys.sort();
        assert_eq!(keys, ["s1/a1", "w1/a2"]);
    }

    #[test]
    fn only_unnamed_content_older_than_the_grace_period_is_an_orphan() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let hour = Duration::from_secs(3600);
        let entry = |key: &str, age_secs: i64| BlobEntry {
            key: key.into(),
            modified: if age_secs >= 0 {
                now - Duration::from_secs(age_secs.unsigned_abs())
            } else {
                now + Duration::from_secs(age_secs.unsigned_abs())
            },
        };
        let listed = [
            entry("s/named_old", 7200),
            entry("s/orphan_old", 7200),
            entry("s/orphan_exactly_grace", 3600),
            entry("s/orphan_in_flight", 10),
            entry("s/orphan_future", -60),
        ];
        let named: HashSet<String> = ["s/named_old".to_owned()].into();
        assert_eq!(
            orphans(&listed, &named, now, hour),
            ["s/orphan_old", "s/orphan_exactly_grace"]
        );
        assert_eq!(
            orphans(&listed, &named, now, Duration::ZERO),
            [
                "s/orphan_old",
                "s/orphan_exactly_grace",
                "s/orphan_in_flight"
            ]
        );
    }
}
