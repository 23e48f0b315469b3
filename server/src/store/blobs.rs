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
    /// Keys held after `cursor` (from the first with `None`), in the store's order of keys,
    /// each with when its content was last written (for the orphan sweep): at most `limit`
    /// entries looked at (what is no key is looked at and skipped, so a page may hold fewer),
    /// and the cursor to go on from, `None` once the end was reached. A page at a time, so that
    /// a store of millions of keys is never held in memory whole, nor listed in one operation
    /// that must end within one time-out.
    fn list_page(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BlobEntry>, Option<String>), StoreError>;

    /// Every key held ([`Blobs::list_page`], page after page).
    fn list(&self) -> Result<Vec<BlobEntry>, StoreError> {
        let (mut all, mut cursor) = (Vec::new(), None);
        loop {
            let (page, next) = self.list_page(cursor.as_deref(), LIST_PAGE)?;
            all.extend(page);
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }
}

/// How many entries a listing looks at per page ([`Blobs::list_page`]): an S3 listing's own
/// page.
pub const LIST_PAGE: usize = 1_000;

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

    /// In the order of (scope, file name), each directory's names read and sorted for the
    /// page (a scope holds one session's or workspace's artifacts, bounded by its quota).
    fn list_page(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BlobEntry>, Option<String>), StoreError> {
        // The names of a directory's entries that are directories (`dirs`) or not, sorted; a
        // name that is not UTF-8 is no key's part.
        let names = |dir: &Path, dirs: bool| -> Result<Vec<String>, StoreError> {
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(StoreError::io("list", dir, e)),
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir() == dirs))
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort_unstable();
            Ok(names)
        };
        let after = cursor.and_then(|c| c.split_once('/'));
        let (mut out, mut looked) = (Vec::new(), 0);
        // A stray file beside the scopes is no scope (its listing failed, and with it every
        // sweep after).
        for scope in names(&self.root, true)? {
            if after.is_some_and(|(s, _)| scope.as_str() < s) {
                continue;
            }
            let dir = self.root.join(&scope);
            for file in names(&dir, false)? {
                if after.is_some_and(|(s, f)| (scope.as_str(), file.as_str()) <= (s, f)) {
                    continue;
                }
                let key = format!("{scope}/{file}");
                looked += 1;
                // Temporary files of a write in flight, and anything else, are no key.
                if check_key(&key).is_ok()
                    && let Ok(meta) = std::fs::symlink_metadata(dir.join(&file))
                    && meta.is_file()
                {
                    let modified = meta
                        .modified()
                        .map_err(|e| StoreError::io("stat", &dir.join(&file), e))?;
                    out.push(BlobEntry {
                        key: key.clone(),
                        modified,
                    });
                }
                if looked >= limit {
                    return Ok((out, Some(key)));
                }
            }
        }
        Ok((out, None))
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

    /// A listing a page at a time: every key once, in the order of (scope, name) whatever the
    /// page's size, what is no key looked at and skipped, and the end said.
    #[test]
    fn blobs_are_listed_a_page_at_a_time_each_key_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let blobs = FsBlobs::new(&root);
        assert_eq!(blobs.list_page(None, 2).unwrap(), (vec![], None));
        // `a-b/...` sorts before `a/...` as one string, after it as (scope, name).
        let keys = ["a/x", "a/y", "a-b/z", "b/1", "b/2", "b/3", "c_/q"];
        for key in keys {
            blobs.put(key, b"1").unwrap();
        }
        std::fs::write(root.join("b/.2a.tmp"), b"partial").unwrap();
        for limit in 1..=9 {
            let (mut all, mut cursor, mut pages) = (Vec::new(), None, 0);
            loop {
                let (page, next) = blobs.list_page(cursor.as_deref(), limit).unwrap();
                assert!(page.len() <= limit);
                all.extend(page.into_iter().map(|e| e.key));
                pages += 1;
                assert!(pages <= 9, "ends");
                match next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(all, keys, "pages of {limit}");
        }
        assert_eq!(blobs.list().unwrap().len(), keys.len());
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
