//! Small filesystem helpers for the server's own files (never for tool paths).
//!
//! Data at rest is the server user's alone: every directory the server makes in its data dir is
//! created 0700 ([`create_private_dir`]) and every file 0600 ([`PRIVATE_FILE`]), with the mode
//! given to `mkdir`/`open` itself, so no umask widens it and no window leaves it readable.
//! [`tighten_modes`] brings a data dir made by an older version to the same modes.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::ServerError;

/// The mode of every file the server writes in its data dir.
pub const PRIVATE_FILE: u32 = 0o600;
/// The mode of every directory the server makes in its data dir.
pub const PRIVATE_DIR: u32 = 0o700;

/// Creates `path` and its missing parents, each with mode [`PRIVATE_DIR`] (the one place the
/// server makes its directories). An existing directory is left as it is.
pub fn create_private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(path)
}

/// Creates a session's primary workspace root, `sessions/<id>/workspace`: its parents private,
/// the root itself with the process's default mode (what tools and the commands they run need
/// of it is not this module's business). An existing root is left as it is.
pub fn create_workspace_root(path: &Path) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    match std::fs::create_dir(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        other => other,
    }
}

/// Takes group and other bits off `path` beyond `allowed` (0600 for files, 0700 for
/// directories); never follows a symbolic link. Returns whether it changed the mode.
fn tighten(path: &Path, allowed: u32, directory: bool) -> std::io::Result<bool> {
    let mut flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    if directory {
        flags |= nix::fcntl::OFlag::O_DIRECTORY;
    }
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)?;
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    let tight = mode & allowed;
    if tight == mode {
        return Ok(false);
    }
    file.set_permissions(std::fs::Permissions::from_mode(tight))?;
    Ok(true)
}

/// Takes group and other bits off the data dir itself (following a symbolic link to it: the
/// operator may keep it elsewhere). Once it is 0700 nobody else reaches anything below it.
pub fn tighten_data_dir(data_dir: &Path) -> std::io::Result<()> {
    let mode = std::fs::metadata(data_dir)?.permissions().mode() & 0o7777;
    if mode & PRIVATE_DIR != mode {
        std::fs::set_permissions(
            data_dir,
            std::fs::Permissions::from_mode(mode & PRIVATE_DIR),
        )?;
    }
    Ok(())
}

/// Brings a data dir to private modes: the data dir, `tls/`, `workspaces/`, `sessions/`, each
/// session's directory and `artifacts/` become at most 0700, and the files directly in them at
/// most 0600. A primary workspace (`sessions/<id>/workspace`) and what is inside it are left
/// alone. Symbolic links are never followed. Returns how many modes it changed.
pub fn tighten_modes(data_dir: &Path) -> usize {
    let mut changed = 0;
    let dir = |path: &Path, changed: &mut usize| {
        match tighten(path, PRIVATE_DIR, true) {
            Ok(true) => *changed += 1,
            Ok(false) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
            Err(e) => tracing::warn!("cannot make {} private: {e}", path.display()),
        }
        let Ok(entries) = std::fs::read_dir(path) else {
            return false;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                match tighten(&entry.path(), PRIVATE_FILE, false) {
                    Ok(true) => *changed += 1,
                    Ok(false) => {}
                    Err(e) => tracing::warn!("cannot make {} private: {e}", entry.path().display()),
                }
            }
        }
        true
    };
    dir(data_dir, &mut changed);
    dir(&data_dir.join("tls"), &mut changed);
    dir(&data_dir.join("workspaces"), &mut changed);
    let sessions = data_dir.join("sessions");
    if dir(&sessions, &mut changed)
        && let Ok(entries) = std::fs::read_dir(&sessions)
    {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dir(&entry.path(), &mut changed);
                dir(&entry.path().join("artifacts"), &mut changed);
            }
        }
    }
    changed
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. A crash leaves the old or the new version, never a torn file.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ServerError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per write, not only per process: two threads replacing the same file at once
    // (a snapshot and a metadata save, say) must not share, truncate or rename each other's
    // temporary file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(ServerError::io("write", path, e));
    }
    // Renamed, the new version is the file: a failed sync of the directory (which makes the
    // rename survive a crash) is told, not returned. Returned, `token create` said it had
    // failed and showed no token while the token was stored and valid.
    if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        tracing::warn!(
            "{}: written, but its directory could not be synced (a crash may undo it): {e}",
            path.display()
        );
    }
    Ok(())
}

/// The prefix of a directory being deleted by [`remove_dir_by_rename`].
pub const DELETING_PREFIX: &str = ".deleting-";

/// Removes the directory `dir` so that no crash or failure part of the way leaves a partial
/// copy under its name: it is first renamed to a hidden sibling ([`DELETING_PREFIX`]) and the
/// parent synced, then that is removed. A removal that fails there (a read-only directory in a
/// workspace, a crash) leaves only the hidden copy, which [`remove_deleting_leftovers`] sweeps
/// later; nothing can open or adopt it under the old name. `NotFound` when `dir` does not
/// exist.
pub fn remove_dir_by_rename(dir: &Path) -> std::io::Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let aside = parent.join(format!("{DELETING_PREFIX}{name}.{}.{n}", this_run()));
    std::fs::rename(dir, &aside)?;
    std::fs::File::open(parent)?.sync_all()?;
    if let Err(e) = remove_tree(&aside) {
        tracing::warn!(
            "{} was deleted, but what it held is not all removed yet ({e}); it is removed at \
             the next start",
            dir.display()
        );
    }
    Ok(())
}

/// A name for this run of the process, for the directories it is deleting: its pid and when it
/// started (a process id alone repeats, at every start of a container).
fn this_run() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos:x}", std::process::id())
    })
}

/// Removes `dir` and everything in it, making a directory that refuses the removal of its
/// entries (no write permission, as a module cache leaves it) writable first. Never follows a
/// symbolic link.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            make_writable(dir);
            std::fs::remove_dir_all(dir)
        }
        other => other,
    }
}

/// Gives every directory under `dir` (itself included) its owner's write and search bits;
/// never follows a symbolic link.
fn make_writable(dir: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&entry.path());
            }
        }
    }
}

/// Removes what deletions by [`remove_dir_by_rename`] in `parent` left behind (a crash, or a
/// removal that failed), but those this run of the process is making, telling `left` the name
/// each had (for what still names it to go too); returns how many it removed.
pub fn remove_deleting_leftovers(parent: &Path, mut left: impl FnMut(&str)) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Not one this process is removing now: `.deleting-<name>.<run>.<n>`.
        let ours = name.rsplit('.').nth(1) == Some(this_run());
        let leftover = name.starts_with(DELETING_PREFIX)
            && !ours
            && entry.file_type().is_ok_and(|t| t.is_dir());
        if !leftover {
            continue;
        }
        // `.deleting-<name>.<run>.<n>`: the name is what is left once the two numbers go.
        if let Some(was) = name
            .strip_prefix(DELETING_PREFIX)
            .and_then(|rest| rest.rsplitn(3, '.').nth(2))
        {
            left(was);
        }
        match remove_tree(&entry.path()) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
        }
    }
    removed
}

/// What is wrong with a TOML file, on one line: `line N: what` (the parser's own text is a
/// snippet of several lines, which a one-line log or error would show as escapes).
pub fn toml_problem(text: &str, error: &toml::de::Error) -> String {
    let what = error
        .message()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    match error.span() {
        Some(span) => format!(
            "line {}: {what}",
            monad_protocol::text::line_at(text, span.start)
        ),
        None => what,
    }
}

/// The current time as RFC 3339 in UTC, to the second (`2026-11-26T10:00:00Z`).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Formats seconds since the Unix epoch as RFC 3339 UTC.
pub fn rfc3339(secs: u64) -> String {
    let monad_protocol::render::Civil {
        year,
        month,
        day,
        hour,
        minute,
        second,
    } = monad_protocol::render::Civil::from_unix(i64::try_from(secs).unwrap_or(i64::MAX));
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

/// Reads a time as [`rfc3339`] writes it (`YYYY-MM-DDTHH:MM:SSZ`, UTC; fractions of a second
/// ignored) into seconds since the Unix epoch; `None` for anything else.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if b.len() < 20 || !separators.iter().all(|&(i, c)| b[i] == c) || !text.ends_with('Z') {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = text.get(range)?;
        digits
            .bytes()
            .all(|d| d.is_ascii_digit())
            .then(|| digits.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Days from the civil date (the proleptic Gregorian calendar, years starting in March).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hour * 3_600 + minute * 60 + second.min(60)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_reads_back_what_it_writes() {
        for secs in [0, 951_782_400, 1_795_651_199, 4_102_444_800, 1_709_164_800] {
            assert_eq!(
                parse_rfc3339(&rfc3339(secs)),
                Some(secs),
                "{}",
                rfc3339(secs)
            );
        }
        assert_eq!(parse_rfc3339("2026-11-25T23:59:59.5Z"), Some(1_795_651_199));
        for bad in [
            "",
            "2026-11-25",
            "2026-11-25T23:59:59",
            "2026-13-01T00:00:00Z",
            "2026-1a-01T00:00:00Z",
            "+026-11-25T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_651_199), "2026-11-25T23:59:59Z");
    }

    #[test]
    fn private_dirs_are_0700_with_their_parents_and_tightening_skips_workspaces() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        create_private_dir(&root.join("sessions/s1/artifacts")).unwrap();
        create_workspace_root(&root.join("sessions/s1/workspace")).unwrap();
        let mode = |p: &str| {
            std::fs::symlink_metadata(root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        for d in ["", "sessions", "sessions/s1", "sessions/s1/artifacts"] {
            assert_eq!(mode(d), 0o700, "{d}");
        }
        let set = |p: &str, m: u32| {
            std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(m)).unwrap()
        };
        std::fs::write(root.join("sessions/s1/session.md"), "x").unwrap();
        std::fs::write(root.join("sessions/s1/workspace/tool.txt"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        set("sessions/s1", 0o755);
        set("sessions/s1/session.md", 0o644);
        set("sessions/s1/workspace", 0o755);
        set("sessions/s1/workspace/tool.txt", 0o644);
        let etc = std::fs::metadata("/etc/hostname").map(|m| m.permissions().mode());
        assert_eq!(tighten_modes(&root), 2);
        assert_eq!(mode("sessions/s1"), 0o700);
        assert_eq!(mode("sessions/s1/session.md"), 0o600);
        assert_eq!(
            mode("sessions/s1/workspace"),
            0o755,
            "the workspace is not ours"
        );
        assert_eq!(mode("sessions/s1/workspace/tool.txt"), 0o644);
        assert_eq!(
            std::fs::metadata("/etc/hostname")
                .map(|m| m.permissions().mode())
                .ok(),
            etc.ok(),
            "links are not followed"
        );
        assert_eq!(tighten_modes(&root), 0);
    }

    #[test]
    fn write_atomic_replaces_and_sets_the_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
