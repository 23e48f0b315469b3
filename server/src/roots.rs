//! MCP roots: which folder an AI host works in, and which session it lands in (seed 002's
//! workspace registry).
//!
//! An MCP host names its workspace folders as `roots` (`file://` URIs). A root that is, or is
//! inside, a folder this device attached picks that folder; the folder's entry in the registry
//! ([`FolderSessions`], kept behind [`crate::store::FolderStore`]) lists the sessions it was
//! worked in, with their last use, and its active session: the one a host lands in. Everything
//! here is pure: parsing a root ([`parse_root`], shared with the client that sends them),
//! matching ([`best_match`]) and the staleness rule ([`FolderSessions::prune`], with the clock
//! passed in).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub use monad_protocol::roots::{RootError, parse_root};
use serde::{Deserialize, Serialize};

/// A session unused for this long leaves a folder's entry (seed 002: 24 hours). The session
/// itself stays.
pub const STALE_AFTER_MS: u64 = 24 * 60 * 60 * 1000;

/// Which folder the roots pick: the first root (in the host's order) that is, or is inside, one
/// of `folders`, and among the folders that contain it the longest (the innermost). Containment
/// is by whole components: `/a/proj` contains `/a/proj/src`, not `/a/project2`. Returns the
/// root's index and the folder.
pub fn best_match<'a>(roots: &[PathBuf], folders: &[&'a str]) -> Option<(usize, &'a str)> {
    roots.iter().enumerate().find_map(|(i, root)| {
        folders
            .iter()
            .filter(|folder| root.starts_with(Path::new(folder)))
            .max_by_key(|folder| Path::new(folder).components().count())
            .map(|folder| (i, *folder))
    })
}

/// One folder's entry in the registry: the sessions it was worked in and the active one, for one
/// user's device. Kept until every session in it is stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FolderSessions {
    /// The owner.
    pub user: String,
    /// The device the folder is on.
    pub device: String,
    /// The folder's absolute path on that device.
    pub folder: String,
    /// The session a host whose root is in this folder lands in.
    pub active: String,
    /// Session id -> its last use here (Unix milliseconds): landing in it, attaching into it,
    /// starting it with `sessions --new`, its activity (tool calls) as of the entry's last read.
    pub sessions: BTreeMap<String, u64>,
}

/// Folders one user's registry keeps at most, over all their devices: one more forgets the one
/// used longest ago. Without it, a user attaching and landing in ever new paths grew the
/// registry (kept a day) that every landing of every user reads and writes.
pub const MAX_FOLDERS_PER_USER: usize = 1_000;

impl FolderSessions {
    /// The latest use of any of its sessions (Unix ms; 0 for none).
    pub fn last_use(&self) -> u64 {
        self.sessions.values().copied().max().unwrap_or(0)
    }

    /// A new entry whose only (and active) session is `session`, used `now`.
    pub fn new(user: &str, device: &str, folder: &str, session: &str, now: u64) -> FolderSessions {
        FolderSessions {
            user: user.to_owned(),
            device: device.to_owned(),
            folder: folder.to_owned(),
            active: session.to_owned(),
            sessions: BTreeMap::from([(session.to_owned(), now)]),
        }
    }

    /// Notes a use of `session` at `now`; with `activate`, it becomes the active session.
    pub fn use_session(&mut self, session: &str, now: u64, activate: bool) {
        let used = self.sessions.entry(session.to_owned()).or_insert(0);
        *used = (*used).max(now);
        if activate {
            self.active = session.to_owned();
        }
    }

    /// Forgets sessions unused for [`STALE_AFTER_MS`] at `now` (and any the `exists` check says
    /// are gone). When the active session went, the most recently used one left is active.
    /// Returns whether anything changed; an entry with no sessions left is to be removed
    /// ([`FolderSessions::is_empty`]).
    pub fn prune(&mut self, now: u64, exists: impl Fn(&str) -> bool) -> bool {
        let before = self.sessions.len();
        self.sessions
            .retain(|id, used| now.saturating_sub(*used) < STALE_AFTER_MS && exists(id));
        let mut changed = self.sessions.len() != before;
        if !self.sessions.contains_key(&self.active)
            && let Some((latest, _)) = self
                .sessions
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        {
            self.active = latest.clone();
            changed = true;
        }
        changed
    }

    /// [`FolderSessions::prune`] (sessions that exist are kept), each session's use first
    /// brought up to its last activity as its metadata has it (`last_active`, Unix ms): a host
    /// that landed days ago and has worked in the session since keeps it. Returns whether the
    /// entry changed (to be saved) and whether stale sessions went.
    pub fn prune_by_activity(
        &mut self,
        now: u64,
        last_active: &HashMap<String, u64>,
    ) -> (bool, bool) {
        let before = self.clone();
        for (id, used) in &mut self.sessions {
            if let Some(&active) = last_active.get(id) {
                *used = (*used).max(active.min(now));
            }
        }
        let pruned = self.prune(now, |_| true);
        (*self != before, pruned)
    }

    /// No session left: the entry leaves the registry.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_matches_the_innermost_folder_that_contains_it_by_whole_components() {
        let roots = |r: &[&str]| r.iter().map(PathBuf::from).collect::<Vec<_>>();
        let folders = ["/a/proj", "/a/proj/sub", "/b"];
        assert_eq!(
            best_match(&roots(&["/a/proj"]), &folders),
            Some((0, "/a/proj"))
        );
        assert_eq!(
            best_match(&roots(&["/a/proj/src/x"]), &folders),
            Some((0, "/a/proj"))
        );
        assert_eq!(
            best_match(&roots(&["/a/proj/sub/deep"]), &folders),
            Some((0, "/a/proj/sub"))
        );
        assert_eq!(best_match(&roots(&["/a/project2"]), &folders), None);
        assert_eq!(
            best_match(&roots(&["/a"]), &folders),
            None,
            "a parent is not inside"
        );
        // The first root that matches wins, whatever the later ones match.
        assert_eq!(
            best_match(&roots(&["/nowhere", "/b/x", "/a/proj"]), &folders),
            Some((1, "/b"))
        );
        assert_eq!(best_match(&roots(&[]), &folders), None);
        assert_eq!(best_match(&roots(&["/a/proj"]), &[]), None);
    }

    #[test]
    fn sessions_unused_for_a_day_leave_and_the_latest_left_becomes_active() {
        let hour = 60 * 60 * 1000;
        let start = 1_000 * hour;
        let mut entry = FolderSessions::new("ana", "dev", "/a/proj", "s1", start);
        entry.use_session("s2", start + hour, true);
        assert_eq!(entry.active, "s2");
        entry.use_session("s1", start + 2 * hour, false);
        assert_eq!(
            entry.active, "s2",
            "a use alone does not make a session active"
        );

        // Just under a day after its last use, nothing is stale.
        assert!(!entry.prune(start + hour + 24 * hour - 1, |_| true));
        assert_eq!(entry.sessions.len(), 2);
        // s2 (last used at start + 1 h) turns stale a day later; s1 (start + 2 h) is left.
        assert!(entry.prune(start + hour + 24 * hour, |_| true));
        assert_eq!(entry.active, "s1");
        assert_eq!(entry.sessions.keys().collect::<Vec<_>>(), ["s1"]);
        assert!(!entry.is_empty());
        // A deleted session leaves at once.
        assert!(entry.prune(start + 3 * hour, |id| id != "s1"));
        assert!(entry.is_empty());
    }

    #[test]
    fn a_clock_that_went_back_keeps_the_entry() {
        let mut entry = FolderSessions::new("ana", "dev", "/a", "s1", 5_000);
        assert!(!entry.prune(1_000, |_| true));
        assert_eq!(entry.sessions.len(), 1);
    }
}
