//! What a workspace's tools last saw of each file: the [`Stamp`] it had when a tool read or wrote
//! it. A `write_file` replaces a file whole, with what the agent made from what it read; if a
//! command, an editor or the folder's owner changed the file since, that change would be thrown
//! away unseen. Such a write is refused ([`Seen::check`]) until the agent reads the file again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::SandboxError;
use crate::jail::JailPath;

/// A file's inode, size and modification time: another program that writes the file changes
/// one of them, unless it writes as many bytes in place within the file system's clock grain (a
/// few milliseconds on most; two seconds on FAT). Not the change time, which also moves with its
/// mode or owner (a `chmod +x`) and with a rename, none of which changes what a write would lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    ino: u64,
    len: u64,
    modified: (i64, i64),
}

impl Stamp {
    /// Whether `self` and `other` are one version of the file's content.
    fn same_content(&self, other: &Stamp) -> bool {
        self == other
    }

    pub(crate) fn of(meta: &cap_std::fs::Metadata) -> Stamp {
        use cap_std::fs::MetadataExt;
        Stamp {
            ino: meta.ino(),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// Files remembered at most; past it the older half is forgotten, and a write of a forgotten
/// file is not checked, as one of a file never read.
const SEEN_MAX: usize = 4096;

/// The stamp of each file a tool of this workspace read or wrote last, by its path relative to
/// the root as the call named it (a read through a link is remembered under the link's name,
/// which a write, going to the link's target, does not look up: unchecked, never refused).
/// Shared by the workspace's sessions and calls: what one agent read or wrote counts as seen for
/// every agent working in the workspace (a check against changes from outside Monad's tools,
/// not between agents).
#[derive(Debug, Default)]
pub(crate) struct Seen(Mutex<Files>);

#[derive(Debug, Default)]
struct Files {
    stamps: HashMap<PathBuf, (Stamp, u64)>,
    /// Counts what was noted, to forget the oldest.
    next: u64,
}

impl Seen {
    /// Remembers `stamp` as what the tools last saw at `rel`.
    pub(crate) fn note(&self, rel: &Path, stamp: Stamp) {
        let mut files = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let at = files.next;
        files.next += 1;
        files.stamps.insert(rel.to_owned(), (stamp, at));
        if files.stamps.len() > SEEN_MAX {
            let keep_from = at.saturating_sub(SEEN_MAX as u64 / 2);
            files.stamps.retain(|_, (_, noted)| *noted >= keep_from);
        }
    }

    /// Refuses to replace the file at `path`, now stamped `now`, when a tool saw it stamped
    /// otherwise: something else changed it since.
    pub(crate) fn check(&self, path: &JailPath, now: Stamp) -> Result<(), SandboxError> {
        let files = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match files.stamps.get(path.rel()) {
            Some((seen, _)) if !seen.same_content(&now) => Err(SandboxError::Changed(format!(
                "`{}` was changed (by a command, an editor or another program) since it was \
                 last read or written here; nothing was written: read it again and make the \
                 change to what it holds now, or use edit_file",
                path.shown()
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ino: u64) -> Stamp {
        Stamp {
            ino,
            len: 1,
            modified: (0, 0),
        }
    }

    #[test]
    fn the_oldest_half_is_forgotten_past_the_bound() {
        let seen = Seen::default();
        for i in 0..=SEEN_MAX as u64 {
            seen.note(Path::new(&format!("f{i}")), stamp(i));
        }
        let files = seen.0.lock().unwrap();
        assert!(
            files.stamps.len() <= SEEN_MAX / 2 + 1,
            "{}",
            files.stamps.len()
        );
        assert!(
            files
                .stamps
                .contains_key(Path::new(&format!("f{SEEN_MAX}")))
        );
        assert!(!files.stamps.contains_key(Path::new("f0")));
    }
}
