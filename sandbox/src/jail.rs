//! The jail: a workspace root held as an open directory handle.
//!
//! Every path a tool receives goes through [`Jail::resolve`] (a lexical check that turns it into a
//! clean path relative to the root; only a name holding U+FFFD, as listings show bytes that are
//! not UTF-8, is looked up in its directory) and is then opened through the root's
//! [`cap_std::fs::Dir`], which resolves it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`
//! or cap-std's own component-by-component walk. Symbolic links are followed only while they stay
//! beneath the root, so a link swapped in by another process at any moment cannot lead out.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};

use crate::error::{EscapeReason, SandboxError};

/// Most directory entries [`Jail::resolve`] reads to find the names a path spelled with U+FFFD
/// means (see `Jail::unlossy`), over the whole path.
pub const LOSSY_SCAN_MAX: usize = 4096;

/// A workspace root. The only way to build one is [`Jail::open_ambient`], the single place where
/// Monad uses ambient authority on a path; everything else goes through the handle.
#[derive(Debug)]
pub struct Jail {
    dir: Dir,
    /// The root as the operator gave it, made absolute.
    root: PathBuf,
    /// The root with every symbolic link resolved; absolute tool paths may use either form.
    canonical_root: PathBuf,
}

/// A path checked by [`Jail::resolve`]: relative to the root, with no `.`, `..`, or empty
/// components. The empty path is the root itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailPath {
    rel: PathBuf,
    /// The path as the caller gave it, for messages.
    given: String,
}

impl JailPath {
    /// The path relative to the root, `.` for the root itself, ready for the [`Dir`] methods.
    pub fn rel(&self) -> &Path {
        if self.rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &self.rel
        }
    }

    /// The path relative to the root as shown to callers (`.` for the root).
    pub fn display(&self) -> String {
        if self.rel.as_os_str().is_empty() {
            ".".to_owned()
        } else {
            self.rel.to_string_lossy().into_owned()
        }
    }

    /// The path as the caller gave it.
    pub fn given(&self) -> &str {
        &self.given
    }

    /// The path as the caller gave it, escaped for a message (a control or invisible
    /// character, a tab too, as `\u{..}`).
    pub fn shown(&self) -> std::borrow::Cow<'_, str> {
        crate::error::shown(&self.given)
    }

    /// True for the root itself.
    pub fn is_root(&self) -> bool {
        self.rel.as_os_str().is_empty()
    }

    /// The parent directory and the final name; `None` for the root.
    pub fn split(&self) -> Option<(JailPath, &std::ffi::OsStr)> {
        let name = self.rel.file_name()?;
        let parent = self.rel.parent().unwrap_or(Path::new("")).to_path_buf();
        Some((
            JailPath {
                rel: parent,
                given: self.given.clone(),
            },
            name,
        ))
    }

    /// Every path from the root's first child down to this one, outermost first (`a`, `a/b`,
    /// `a/b/c` for `a/b/c`; none for the root), each with this path's spelling for messages.
    pub fn prefixes(&self) -> Vec<JailPath> {
        let mut rel = PathBuf::new();
        self.rel
            .components()
            .map(|component| {
                rel.push(component);
                JailPath {
                    rel: rel.clone(),
                    given: self.given.clone(),
                }
            })
            .collect()
    }

    /// This path with `name` appended.
    pub fn join(&self, name: &std::ffi::OsStr) -> JailPath {
        JailPath {
            rel: self.rel.join(name),
            given: self.given.clone(),
        }
    }
}

impl Jail {
    /// Opens `root` as a workspace root.
    ///
    /// # Ambient authority
    ///
    /// This is the one call that opens a path with the process's full authority. The path must
    /// come from the operator or the user (a command line, a config file), never from a tool
    /// argument.
    pub fn open_ambient(root: &Path) -> io::Result<Jail> {
        let absolute = std::path::absolute(root)?;
        let canonical_root = absolute.canonicalize()?;
        let dir = Dir::open_ambient_dir(&canonical_root, ambient_authority())?;
        Ok(Jail {
            dir,
            root: absolute,
            canonical_root,
        })
    }

    /// The root directory handle.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The root's absolute path with symbolic links resolved (for display, and for placing a
    /// command's sandbox; never used to open tool paths).
    pub fn root_path(&self) -> &Path {
        &self.canonical_root
    }

    /// `path` with a final symbolic link resolved inside the root (the canonical path, with no
    /// links left in it), keeping the name the caller gave; `path` itself when it is not a link.
    /// A link leading out of the root is refused; one whose target does not exist says so.
    pub fn through_final_link(&self, path: &JailPath) -> Result<JailPath, SandboxError> {
        let linked = self
            .dir
            .symlink_metadata(path.rel())
            .is_ok_and(|m| m.file_type().is_symlink());
        if !linked {
            return Ok(path.clone());
        }
        self.canonical(path).map_err(|e| match e {
            SandboxError::NotFound(_) => SandboxError::WrongFileType {
                path: path.given().to_owned(),
                what: "is a symbolic link whose target does not exist",
            },
            other => other,
        })
    }

    /// `path` with every symbolic link on it resolved inside the root, as the kernel takes a
    /// directory it opens (so that a `..` after it climbs from where its links lead), keeping
    /// the name the caller gave. A link leading out of the root is refused.
    pub fn canonical(&self, path: &JailPath) -> Result<JailPath, SandboxError> {
        let resolved = self
            .dir
            .canonicalize(path.rel())
            .map_err(|e| SandboxError::from_io("resolve", path.given(), e))?;
        // The target's own bytes, folded as a path is (no text in between: a name that is not
        // UTF-8 stays exactly that name).
        Ok(JailPath {
            rel: fold(&resolved.to_string_lossy(), &resolved)?,
            given: path.given().to_owned(),
        })
    }

    /// `raw`, a relative path, from `base` as the kernel takes a path that climbs: its names up
    /// to its last `..` resolved on disk ([`Jail::canonical`]), each link followed (inside the
    /// root) before a `..` after it climbs, so that `bin/link/../x` climbs from where `link`
    /// leads. Answers that directory and the rest of `raw` after it; `None` when `raw` holds no
    /// `..`. A climb out of the root, by the `..`s themselves or through a link, is refused.
    /// `given`: the path as errors name it (the caller's whole path, when `raw` is its tail).
    pub fn climbed<'a>(
        &self,
        base: &JailPath,
        raw: &'a str,
        given: &str,
    ) -> Result<Option<(JailPath, &'a str)>, SandboxError> {
        let mut last = None;
        let mut at = 0;
        for name in raw.split('/') {
            at += name.len() + 1;
            if name == ".." {
                last = Some(at.min(raw.len()));
            }
        }
        let Some(end) = last else {
            return Ok(None);
        };
        let (head, rest) = raw.split_at(end);
        let joined = JailPath {
            rel: base.rel.join(head),
            given: given.to_owned(),
        };
        let dir = self.canonical(&joined).map_err(|e| match e {
            // Climbing out as text too: the `..`s did it, whatever links are on the way.
            SandboxError::Escape { .. } if fold(given, &joined.rel).is_err() => {
                SandboxError::Escape {
                    path: given.to_owned(),
                    reason: EscapeReason::ParentTraversal,
                }
            }
            other => other,
        })?;
        // `..//x` names `x` there, as the kernel reads it, not `/x`.
        Ok(Some((dir, rest.trim_start_matches('/'))))
    }

    /// What follows the root in the absolute `text`, when it starts with the root (either
    /// spelling) as whole components, as [`Jail::resolve`] takes an absolute path; `None`
    /// otherwise. Nothing after the root is looked at: a glob pattern may follow, and the root's
    /// own name may hold `[` or `{`.
    pub fn strip_root<'a>(&self, text: &'a str) -> Option<&'a str> {
        [&self.canonical_root, &self.root]
            .iter()
            .find_map(|root| Path::new(text).strip_prefix(root).ok()?.to_str())
    }

    /// Checks `raw` lexically and turns it into a clean path relative to the root.
    ///
    /// Refuses NUL bytes, absolute paths outside the root (either spelling of the root is
    /// accepted as a prefix), and `..` that would climb above the root. `..` inside the root is
    /// folded lexically (`a/../b` is `b`). `~`, backslashes and `%2e` are ordinary characters.
    /// This check does not look at the disk (links are handled when the path is opened), but for
    /// a path holding U+FFFD: see [`Jail::unlossy`].
    pub fn resolve(&self, raw: &str) -> Result<JailPath, SandboxError> {
        let path = Path::new(raw);
        let relative = if path.is_absolute() && !raw.contains('\0') {
            self.strip_root(raw)
                .map(Path::new)
                .ok_or_else(|| SandboxError::Escape {
                    path: raw.to_owned(),
                    reason: EscapeReason::AbsoluteOutside,
                })?
        } else {
            path
        };
        self.looked_up(fold(raw, relative)?, raw)
    }

    /// `rel`, folded from `raw`, as a [`JailPath`]: through [`Jail::unlossy`] when `raw` holds
    /// U+FFFD.
    fn looked_up(&self, rel: PathBuf, raw: &str) -> Result<JailPath, SandboxError> {
        let rel = if raw.contains('\u{FFFD}') {
            self.unlossy(rel, raw)?
        } else {
            rel
        };
        Ok(JailPath {
            rel,
            given: raw.to_owned(),
        })
    }

    /// `raw`, a relative path, taken from `base` as a command takes a path from its working
    /// directory: `base`'s own bytes joined with `raw`, checked and folded as [`Jail::resolve`]
    /// does (no climbing above the root), where only `raw`'s names spelled with U+FFFD are
    /// looked up (a name of `base` that is not UTF-8 stays exactly that name).
    pub fn resolve_from(&self, base: &JailPath, raw: &str) -> Result<JailPath, SandboxError> {
        self.looked_up(Jail::spelled_from(base, raw)?, raw)
    }

    /// [`Jail::resolve_from`] without the lookup: the path as spelled, folded. Pure.
    pub fn spelled_from(base: &JailPath, raw: &str) -> Result<PathBuf, SandboxError> {
        fold(raw, &base.rel.join(raw))
    }

    /// `rel` with each name that holds U+FFFD replaced by the one entry of its directory whose
    /// name is not UTF-8 and reads so decoded lossily, as listings, globs and searches show it: a
    /// tool's path is text, which cannot spell such a name otherwise. A name spelled so that
    /// matches no such entry stays as spelled (it may exist with U+FFFD itself, or be created);
    /// one that matches two entries, or an entry and itself spelled with U+FFFD, is refused,
    /// since which one is meant cannot be told. The directories on the way are opened through
    /// the root's handle, as any path's are (links followed only while they stay inside), and
    /// what is found is a plain name in its directory, which is then opened like any other; so
    /// this reaches nothing a path of UTF-8 names could not. At most [`LOSSY_SCAN_MAX`] entries
    /// are read per path, whichever thread resolves it (links can make one path name a
    /// directory many times): past that, the path is refused.
    fn unlossy(&self, rel: PathBuf, raw: &str) -> Result<PathBuf, SandboxError> {
        let ambiguous = |parent: &Path, shown: &str| {
            SandboxError::Unspellable(format!(
                "`{}`: more than one name in `{}` reads `{}` (`\u{FFFD}` stands for bytes \
                 of a name that are not UTF-8), so which one is meant cannot be told; a command \
                 reaches them through a shell glob (`run_command` with `sh -c`)",
                crate::error::shown(raw),
                crate::error::shown(&parent.to_string_lossy()),
                crate::error::shown(shown)
            ))
        };
        let mut budget = LOSSY_SCAN_MAX;
        let mut found = PathBuf::new();
        for name in rel.iter() {
            let spelled = found.join(name);
            let Some(shown) = name.to_str().filter(|n| n.contains('\u{FFFD}')) else {
                found = spelled;
                continue;
            };
            let parent = if found.as_os_str().is_empty() {
                Path::new(".")
            } else {
                found.as_path()
            };
            // A directory that cannot be opened or read here fails as itself when the path is
            // opened.
            let Ok(entries) = self.dir.open_dir(parent).and_then(|dir| dir.entries()) else {
                found = spelled;
                continue;
            };
            let mut matches = Vec::new();
            for entry in entries {
                let Some(left) = budget.checked_sub(1) else {
                    return Err(SandboxError::Unspellable(format!(
                        "`{}`: looked through {LOSSY_SCAN_MAX} entries for the names that \
                         read as it does (`\u{FFFD}` stands for bytes of a name that are not \
                         UTF-8), and stopped; a command reaches such a name through a shell \
                         glob (`run_command` with `sh -c`)",
                        crate::error::shown(raw)
                    )));
                };
                budget = left;
                let Ok(entry) = entry else {
                    matches.clear();
                    break;
                };
                let entry = entry.file_name();
                if entry.to_str().is_none() && entry.to_string_lossy() == shown {
                    matches.push(entry);
                }
            }
            match matches.len() {
                0 => found = spelled,
                // One, unless the name spelled with U+FFFD itself is there too.
                1 if self.dir.symlink_metadata(&spelled).is_err() => {
                    found.push(matches.remove(0));
                }
                _ => return Err(ambiguous(parent, shown)),
            }
        }
        Ok(found)
    }

    /// What [`Jail::resolve`] refuses whatever the root is: a NUL byte, and a relative path
    /// whose `..` climbs above where it starts. (Whether an absolute path is inside depends on
    /// the root.) Routing asks this before it looks for the path in every workspace, so that
    /// such a path is refused for what it is, not reported as found nowhere.
    pub fn refused_under_any_root(raw: &str) -> Option<SandboxError> {
        if Path::new(raw).is_absolute() && !raw.contains('\0') {
            return None;
        }
        fold(raw, Path::new(raw)).err()
    }

    /// Opens a regular file for reading. Devices, FIFOs and sockets are refused without blocking:
    /// the file is opened with `O_NONBLOCK | O_NOCTTY` and checked with `fstat` on the open
    /// descriptor, so a file swapped for a FIFO between a check and the open cannot hang us.
    pub fn open_regular(
        &self,
        path: &JailPath,
    ) -> Result<(File, cap_std::fs::Metadata), SandboxError> {
        open_regular_in(&self.dir, path.rel(), path.given())
    }

    /// Opens a directory inside the root (following links only while they stay inside).
    pub fn open_dir(&self, path: &JailPath) -> Result<Dir, SandboxError> {
        if path.is_root() {
            return self
                .dir
                .try_clone()
                .map_err(|e| SandboxError::from_io("open", path.given(), e));
        }
        self.dir
            .open_dir(path.rel())
            .map_err(|e| SandboxError::from_io("open directory", path.given(), e))
    }
}

/// Opens `name` (relative to `dir`) as a regular file for reading, refusing anything else.
pub(crate) fn open_regular_in(
    dir: &Dir,
    rel: &Path,
    given: &str,
) -> Result<(File, cap_std::fs::Metadata), SandboxError> {
    // Looked at before it is opened: a device's open is its driver's (a serial port raises
    // DTR, a tape rewinds, a FIFO wakes its writer). The open is checked again below, for
    // what was put in its place between the two.
    if let Ok(meta) = dir.metadata(rel) {
        check_regular(&meta, given)?;
    }
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY);
    let file = dir
        .open_with(rel, &options)
        .map_err(|e| SandboxError::from_io("open", given, e))?;
    let meta = file
        .metadata()
        .map_err(|e| SandboxError::from_io("stat", given, e))?;
    check_regular(&meta, given)?;
    Ok((file, meta))
}

/// Opens `name` in `dir` as a regular file without following a final symbolic link.
pub(crate) fn open_regular_nofollow(
    dir: &Dir,
    name: &Path,
    given: &str,
) -> Result<(File, cap_std::fs::Metadata), SandboxError> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY);
    let file = dir
        .open_with(name, &options)
        .map_err(|e| SandboxError::from_io("open", given, e))?;
    let meta = file
        .metadata()
        .map_err(|e| SandboxError::from_io("stat", given, e))?;
    check_regular(&meta, given)?;
    Ok((file, meta))
}

fn check_regular(meta: &cap_std::fs::Metadata, given: &str) -> Result<(), SandboxError> {
    let kind = meta.file_type();
    if kind.is_file() {
        Ok(())
    } else if kind.is_dir() {
        Err(SandboxError::WrongFileType {
            path: given.to_owned(),
            what: "is a directory",
        })
    } else {
        Err(SandboxError::Escape {
            path: given.to_owned(),
            reason: EscapeReason::SpecialFile,
        })
    }
}

/// Reads a whole regular file, refusing one larger than `cap` bytes.
pub(crate) fn read_capped(
    mut file: File,
    size_hint: u64,
    cap: u64,
    given: &str,
) -> Result<Vec<u8>, SandboxError> {
    if size_hint > cap {
        return Err(SandboxError::LimitExceeded(format!(
            "`{}` is {size_hint} bytes, over the {cap}-byte limit for this operation",
            crate::error::shown(given)
        )));
    }
    let mut buf = Vec::with_capacity(size_hint as usize + 1);
    (&mut file)
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| SandboxError::from_io("read", given, e))?;
    if buf.len() as u64 > cap {
        return Err(SandboxError::LimitExceeded(format!(
            "`{}` grew past the {cap}-byte limit for this operation while being read",
            crate::error::shown(given)
        )));
    }
    Ok(buf)
}

/// `relative` (`raw` stripped of the root, or `raw` itself) as a clean path below the root:
/// `.` dropped, `..` folded, refused when it would climb above the root; `raw` refused when it
/// holds a NUL byte.
fn fold(raw: &str, relative: &Path) -> Result<PathBuf, SandboxError> {
    if raw.contains('\0') {
        return Err(SandboxError::InvalidPath {
            path: raw.replace('\0', "\\0"),
            why: "it contains a NUL byte",
        });
    }
    let mut rel = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => rel.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                if !rel.pop() {
                    return Err(SandboxError::Escape {
                        path: raw.to_owned(),
                        reason: EscapeReason::ParentTraversal,
                    });
                }
            }
            // An absolute path was stripped of the root, so a root or prefix component can only
            // mean a path such as `//x` that is not inside the root.
            Component::RootDir | Component::Prefix(_) => {
                return Err(SandboxError::Escape {
                    path: raw.to_owned(),
                    reason: EscapeReason::AbsoluteOutside,
                });
            }
        }
    }
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jail() -> (tempfile::TempDir, Jail) {
        let tmp = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(tmp.path()).unwrap();
        (tmp, jail)
    }

    #[test]
    fn a_climbing_path_is_resolved_up_to_its_last_parent_as_the_kernel_takes_it() {
        use monad_protocol::ErrorCode;
        let (tmp, jail) = jail();
        std::fs::create_dir_all(tmp.path().join("deep/a/b")).unwrap();
        std::fs::write(tmp.path().join("deep/file"), "").unwrap();
        std::os::unix::fs::symlink("deep/a/b", tmp.path().join("link")).unwrap();
        let root = jail.resolve("").unwrap();
        let climbed = |raw: &str| {
            jail.climbed(&root, raw, raw)
                .map(|found| found.map(|(dir, rest)| (dir.rel().to_owned(), rest.to_owned())))
        };
        assert_eq!(climbed("deep/a/x").unwrap(), None);
        for (raw, dir, rest) in [
            ("link/../x", "deep/a", "x"),
            ("link/..", "deep/a", ""),
            ("link/../", "deep/a", ""),
            ("link/..//x/y", "deep/a", "x/y"),
            ("./link/../../x", "deep", "x"),
            ("deep/a/b/../../..", ".", ""),
        ] {
            assert_eq!(
                climbed(raw).unwrap(),
                Some((PathBuf::from(dir), rest.to_owned())),
                "{raw}"
            );
        }
        let err = climbed("deep/file/../x").unwrap_err();
        assert_eq!(err.code(), ErrorCode::WrongFileType, "{err}");
        let err = climbed("nodir/../x").unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
        std::os::unix::fs::symlink("../..", tmp.path().join("deep/out")).unwrap();
        for (raw, why) in [("../x", "climb above"), ("deep/out/../x", "symbolic link")] {
            let err = climbed(raw).unwrap_err();
            assert_eq!(err.code(), ErrorCode::OutsideWorkspace, "{raw}: {err}");
            assert!(err.to_string().contains(why), "{raw}: {err}");
        }
    }

    #[test]
    fn resolve_folds_dots_inside_the_root() {
        let (_tmp, jail) = jail();
        assert_eq!(jail.resolve("a/./b/../c").unwrap().display(), "a/c");
        assert_eq!(jail.resolve("").unwrap().display(), ".");
        assert_eq!(jail.resolve(".").unwrap().display(), ".");
        assert_eq!(jail.resolve("a/..").unwrap().display(), ".");
        assert!(jail.resolve("a/..").unwrap().is_root());
    }

    #[test]
    fn resolve_refuses_parent_traversal_in_any_position() {
        let (_tmp, jail) = jail();
        for raw in ["..", "../x", "a/../../x", "./..", "a/b/../../..", "x/.."] {
            let result = jail.resolve(raw);
            if raw == "x/.." {
                assert!(result.is_ok());
                continue;
            }
            match result {
                Err(SandboxError::Escape { reason, .. }) => {
                    assert_eq!(reason, EscapeReason::ParentTraversal, "{raw}")
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
    }

    #[test]
    fn resolve_accepts_absolute_paths_inside_the_root_only() {
        let (tmp, jail) = jail();
        let inside = tmp.path().join("a/b");
        assert_eq!(
            jail.resolve(inside.to_str().unwrap()).unwrap().display(),
            "a/b"
        );
        let sibling = format!("{}_evil/x", tmp.path().display());
        assert!(matches!(
            jail.resolve(&sibling),
            Err(SandboxError::Escape {
                reason: EscapeReason::AbsoluteOutside,
                ..
            })
        ));
        assert!(jail.resolve("/etc/passwd").is_err());
        let climbing = format!("{}/../x", tmp.path().display());
        assert!(jail.resolve(&climbing).is_err());
    }

    #[test]
    fn resolve_takes_tilde_backslash_and_percent_literally() {
        let (_tmp, jail) = jail();
        assert_eq!(jail.resolve("~/x").unwrap().display(), "~/x");
        assert_eq!(jail.resolve("..\\x").unwrap().display(), "..\\x");
        assert_eq!(jail.resolve("%2e%2e/x").unwrap().display(), "%2e%2e/x");
    }

    #[test]
    fn a_name_that_is_not_utf8_is_reached_by_the_name_a_listing_shows() {
        use std::os::unix::ffi::OsStrExt;
        let (tmp, jail) = jail();
        let raw = |bytes: &[u8]| std::ffi::OsStr::from_bytes(bytes).to_owned();
        std::fs::create_dir(tmp.path().join(raw(b"d\xff"))).unwrap();
        std::fs::write(tmp.path().join(raw(b"d\xff")).join(raw(b"caf\xe9")), "x").unwrap();
        let path = jail.resolve("d\u{FFFD}/caf\u{FFFD}").unwrap();
        assert_eq!(path.rel().as_os_str().as_bytes(), b"d\xff/caf\xe9");
        assert_eq!(path.given(), "d\u{FFFD}/caf\u{FFFD}");
        assert!(jail.open_regular(&path).is_ok());
        // A name spelled with U+FFFD itself is that name, unless another reads so too.
        std::fs::write(tmp.path().join("caf\u{FFFD}"), "literal").unwrap();
        assert_eq!(
            jail.resolve("caf\u{FFFD}").unwrap().rel(),
            Path::new("caf\u{FFFD}")
        );
        std::fs::write(tmp.path().join(raw(b"caf\xe8")), "latin").unwrap();
        assert!(matches!(
            jail.resolve("caf\u{FFFD}"),
            Err(SandboxError::Unspellable(_))
        ));
        // A final link to such a name is followed to its exact bytes.
        std::os::unix::fs::symlink(raw(b"d\xff"), tmp.path().join("to_d")).unwrap();
        let linked = jail
            .through_final_link(&jail.resolve("to_d").unwrap())
            .unwrap();
        assert_eq!(linked.rel().as_os_str().as_bytes(), b"d\xff");
        // The entries read for one path are bounded, links or not.
        let big = tmp.path().join("big");
        std::fs::create_dir(&big).unwrap();
        for i in 0..=LOSSY_SCAN_MAX {
            std::fs::write(big.join(format!("f{i}")), "").unwrap();
        }
        let err = jail.resolve("big/x\u{FFFD}").unwrap_err();
        assert!(matches!(err, SandboxError::Unspellable(_)), "{err:?}");
        assert!(err.to_string().contains("stopped"), "{err}");
        // Nothing reads so: the path stays as spelled (and is not found when opened).
        assert_eq!(
            jail.resolve("new\u{FFFD}").unwrap().rel(),
            Path::new("new\u{FFFD}")
        );
        // Two that read the same: which one is meant cannot be told.
        std::fs::write(tmp.path().join(raw(b"two\xe8")), "a").unwrap();
        std::fs::write(tmp.path().join(raw(b"two\xe9")), "b").unwrap();
        let err = jail.resolve("two\u{FFFD}").unwrap_err();
        assert!(matches!(err, SandboxError::Unspellable(_)), "{err:?}");
        // `..` is folded before any lookup, and still cannot climb out.
        assert!(jail.resolve("d\u{FFFD}/../../x").is_err());
    }

    #[test]
    fn resolve_refuses_nul_bytes() {
        let (_tmp, jail) = jail();
        let err = jail.resolve("a\0b").unwrap_err();
        assert!(err.to_string().contains("NUL"), "{err}");
    }
}
