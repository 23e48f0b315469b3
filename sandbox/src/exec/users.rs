//! Users of their own for workspaces, when Monad runs as root.
//!
//! A command never runs as root; when nothing else decides its user (`[exec] user`, or the
//! owner of its workspace's folder), it runs as a uid (and gid) that belongs to its workspace
//! alone, from `[exec] uid_range`: no user or group of the system has it, no process on the host
//! runs with it, and no other workspace has it. A server's primary workspace gets one when it
//! is made (the folder is given to it, so the owner rule finds it again after a restart); a
//! folder root owns, as a root client may attach, gets one for as long as it is open. A shared
//! user (`nobody`) would let every process of that user (daemons, other workspaces' commands)
//! reach a running command: its `/proc/<pid>/cwd`, its namespaces, its temporary files, its
//! supervisor.
//!
//! The choice of a uid is a pure function of the workspace's path and what is taken
//! ([`candidates`]); what is taken is read from the host when a uid is chosen.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use super::Identity;
use crate::error::SandboxError;

/// The default `[exec] uid_range`: systemd's unused range `0x70000000`–`0x7FFDFFFF` (above the
/// users of the system, `DynamicUser=` and `nobody`, above the container ranges of
/// `systemd-nspawn` and the `subuid` ranges of rootless containers, below systemd's "foreign"
/// range and the values above 2^31 that some tools read as negative).
pub const DEFAULT_UID_RANGE: [u32; 2] = [0x7000_0000, 0x7FFD_FFFF];

/// Uids this process handed out: persistent ones stay listed (their folders have them too),
/// those of folders root owns until the folder is closed. Its lock makes one choice at a time.
static HANDED_OUT: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Candidates tried for one workspace at most.
const MAX_TRIES: usize = 4096;

/// The range `[first, last]` of `[exec] uid_range`, or why it cannot be used (pure): it must
/// hold neither root nor the 16-bit `nobody` and `-1` (65534, 65535) nor the 32-bit `-1`.
pub fn check_range(range: [u32; 2]) -> Result<(u32, u32), String> {
    let [first, last] = range;
    if first == 0 || first > last || last == u32::MAX {
        return Err(format!(
            "[exec] uid_range = [{first}, {last}] must be [first, last] with 0 < first <= last \
             < 4294967295"
        ));
    }
    if (first..=last).contains(&65534) || (first..=last).contains(&65535) {
        return Err(format!(
            "[exec] uid_range = [{first}, {last}] holds 65534 or 65535 (`nobody`, and -1 in 16 \
             bits); choose a range clear of them"
        ));
    }
    Ok((first, last))
}

/// The uids tried for the workspace `key` (its path) in `[first, last]`, in order (pure): from a
/// point of the range that `key` decides (FNV-1a), onwards, wrapping around.
pub fn candidates(key: &[u8], (first, last): (u32, u32)) -> impl Iterator<Item = u32> {
    let count = u64::from(last - first) + 1;
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let start = hash % count;
    (0..count.min(MAX_TRIES as u64)).map(move |k| first + ((start + k) % count) as u32)
}

/// Every uid and gid a process on the host runs with (real, effective, saved, filesystem).
fn in_use_by_processes() -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return ids;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .as_encoded_bytes()
            .iter()
            .all(u8::is_ascii_digit)
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            if let Some(values) = line
                .strip_prefix("Uid:")
                .or_else(|| line.strip_prefix("Gid:"))
            {
                ids.extend(
                    values
                        .split_whitespace()
                        .filter_map(|v| v.parse::<u32>().ok()),
                );
            }
        }
    }
    ids
}

/// Owners (uid and gid) of the workspaces beside `root`: the folders of the same name one level
/// up (`<dir>/*/<name>`), as a server keeps `sessions/<id>/workspace`.
fn neighbours(root: &Path) -> BTreeSet<u32> {
    use std::os::unix::fs::MetadataExt;
    let mut ids = BTreeSet::new();
    let (Some(name), Some(above)) = (root.file_name(), root.parent().and_then(Path::parent)) else {
        return ids;
    };
    let Ok(entries) = std::fs::read_dir(above) else {
        return ids;
    };
    for entry in entries.flatten() {
        if let Ok(meta) = std::fs::symlink_metadata(entry.path().join(name)) {
            ids.insert(meta.uid());
            ids.insert(meta.gid());
        }
    }
    ids
}

/// A user of its own for the workspace at `root`, from `range` (see the module documentation):
/// its uid and gid are one number.
pub(crate) fn allocate(root: &Path, range: [u32; 2]) -> Result<Identity, SandboxError> {
    let range = check_range(range).map_err(SandboxError::SandboxUnavailable)?;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let processes = in_use_by_processes();
    let neighbours = neighbours(root);
    let key = root.as_os_str().as_encoded_bytes();
    let free = |uid: u32| {
        !handed_out.contains(&uid)
            && !processes.contains(&uid)
            && !neighbours.contains(&uid)
            && nix::unistd::User::from_uid(uid.into()).is_ok_and(|u| u.is_none())
            && nix::unistd::Group::from_gid(uid.into()).is_ok_and(|g| g.is_none())
    };
    let uid = candidates(key, range)
        .find(|uid| free(*uid))
        .ok_or_else(|| {
            SandboxError::SandboxUnavailable(format!(
                "no free uid for a workspace's commands in [exec] uid_range = [{}, {}] (tried {})",
                range.0, range.1, MAX_TRIES
            ))
        })?;
    handed_out.insert(uid);
    Ok(Identity { uid, gid: uid })
}

/// Gives back a uid of a folder that is closed (see [`allocate`]).
pub(crate) fn release(uid: u32) {
    HANDED_OUT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&uid);
}

/// Gives `root` and everything under it that belongs to `old` (uid) to `new`, through directory
/// handles (never following a link, nor leaving the root's filesystem), for a workspace that an
/// older Monad gave to a shared user. A file with more than one name is left alone: one of its
/// names may lie outside.
pub(crate) fn give_tree(root: &Path, old: u32, new: Identity) -> std::io::Result<()> {
    use cap_fs_ext::DirExt;
    use cap_std::fs::MetadataExt;
    let top = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
    let device = top.dir_metadata()?.dev();
    let chown = |dir: &cap_std::fs::Dir, name: &std::ffi::OsStr| {
        nix::unistd::fchownat(
            dir,
            name,
            Some(new.uid.into()),
            Some(new.gid.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(std::io::Error::from)
    };
    let mut stack = vec![top];
    while let Some(dir) = stack.pop() {
        for entry in dir.entries()? {
            let entry = entry?;
            let name = entry.file_name();
            let meta = entry.metadata()?;
            if meta.uid() == old && !(meta.is_file() && meta.nlink() > 1) {
                chown(&dir, &name)?;
            }
            if meta.is_dir()
                && meta.dev() == device
                && let Ok(below) = dir.open_dir_nofollow(&name)
            {
                stack.push(below);
            }
        }
    }
    std::os::unix::fs::lchown(root, Some(new.uid), Some(new.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_range_never_holds_root_or_nobody() {
        assert!(check_range(DEFAULT_UID_RANGE).is_ok());
        assert!(check_range([0, 10]).is_err());
        assert!(check_range([60_000, 70_000]).is_err());
        assert!(check_range([100_000, 99_999]).is_err());
        assert!(check_range([100_000, u32::MAX]).is_err());
        assert_eq!(check_range([100_000, 100_000]), Ok((100_000, 100_000)));
    }

    #[test]
    fn candidates_stay_in_the_range_and_differ_by_workspace() {
        let range = (1_000_000, 1_000_009);
        let a: Vec<u32> = candidates(b"/data/sessions/a/workspace", range).collect();
        let b: Vec<u32> = candidates(b"/data/sessions/b/workspace", range).collect();
        assert_eq!(a.len(), 10, "every uid of a small range is tried once");
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (1_000_000..=1_000_009).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert_eq!(
            a,
            candidates(b"/data/sessions/a/workspace", range).collect::<Vec<_>>(),
            "the same workspace, the same order"
        );
        let big: Vec<u32> = candidates(b"x", check_range(DEFAULT_UID_RANGE).unwrap()).collect();
        assert_eq!(big.len(), MAX_TRIES);
        assert!(
            big.iter()
                .all(|u| (DEFAULT_UID_RANGE[0]..=DEFAULT_UID_RANGE[1]).contains(u))
        );
    }
}
