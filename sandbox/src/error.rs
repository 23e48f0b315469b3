//! The sandbox's error type, and how each kind maps to a wire [`ErrorCode`].

use std::io;

use monad_protocol::{ErrorCode, ToolError};

/// Why a path was refused by the jail. Every refusal is one [`SandboxError::Escape`] with one of
/// these reasons, so there is a single message format for every escape attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapeReason {
    /// `..` would climb above the workspace root.
    ParentTraversal,
    /// An absolute path that is not inside the workspace root.
    AbsoluteOutside,
    /// Resolution left the root through a symbolic link or a magic link (`/proc/self/...`).
    LinkOutside,
    /// The path names a device, FIFO or socket, which the jail never opens.
    SpecialFile,
}

impl EscapeReason {
    fn explain(self) -> &'static str {
        match self {
            EscapeReason::ParentTraversal => "`..` would climb above the workspace root",
            EscapeReason::AbsoluteOutside => "it is an absolute path outside the workspace root",
            EscapeReason::LinkOutside => {
                "it resolves outside the workspace root through a symbolic link"
            }
            EscapeReason::SpecialFile => {
                "it is a device, FIFO or socket, which the workspace never opens"
            }
        }
    }
}

/// Everything that can go wrong in the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The jail refused a path; nothing was read or changed.
    #[error("refused `{}`: {}", shown(path), reason.explain())]
    Escape {
        /// The path as the caller gave it.
        path: String,
        /// Why it was refused.
        reason: EscapeReason,
    },
    /// The path is malformed (a NUL byte, an empty name where one is needed).
    #[error("invalid path `{}`: {why}", shown(path))]
    InvalidPath {
        /// The path as the caller gave it (NUL bytes shown escaped).
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The arguments do not fit the tool or each other. The message alone: its code,
    /// `invalid_arguments`, goes before it wherever it is shown.
    #[error("{0}")]
    InvalidArguments(String),
    /// A path spelled with U+FFFD (as a listing shows bytes of a name that are not UTF-8) that
    /// cannot be looked up: two names read as it does, or the lookup's bound was reached (see
    /// `Jail::unlossy`). The name may well be there; its code is `invalid_arguments`.
    #[error("{0}")]
    Unspellable(String),
    /// Nothing exists at the path; the message names it.
    #[error("{0}")]
    NotFound(String),
    /// The path exists but is the wrong kind of thing for this operation.
    #[error("{} {what}", quoted(path))]
    WrongFileType {
        /// The path as the caller gave it.
        path: String,
        /// What it is, or is not (`is a directory`, `is not a directory`, ...).
        what: &'static str,
    },
    /// A symbolic link loop, or a chain of links too long to follow.
    #[error("`{}` has too many levels of symbolic links (a link loop?)", shown(.0))]
    LinkLoop(String),
    /// `edit_file` could not find a unique `old_string`.
    #[error("{0}")]
    NoMatch(String),
    /// A hard limit was hit.
    #[error("{0}")]
    LimitExceeded(String),
    /// Commands cannot be sandboxed on this kernel and the operator did not allow running them
    /// unsandboxed.
    #[error("commands cannot run here: {0}")]
    SandboxUnavailable(String),
    /// A process did not do something in time (take its input, ...).
    #[error("{0}")]
    Timeout(String),
    /// What the call would do now is not what its owner approved (the folder changed while
    /// the prompt waited); nothing was done.
    #[error("{0}")]
    Unapproved(String),
    /// A write to a file no agent may write (git's own files, or one its user may not write);
    /// nothing was written.
    #[error("{0}")]
    Protected(String),
    /// The file a write was to replace changed under it (another program wrote it); nothing
    /// was written.
    #[error("{0}")]
    Changed(String),
    /// The operating system failed an operation.
    #[error("{op} {}: {source}", quoted(path))]
    Io {
        /// What was being done (`read`, `write`, `list`, ...).
        op: &'static str,
        /// The path as the caller gave it.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// A path as the caller gave it, for a message: in backquotes, or, when it was empty, said so
/// (an empty path is the workspace root).
fn quoted(path: &str) -> String {
    if path.is_empty() {
        "the workspace root (an empty path)".to_owned()
    } else {
        format!("`{}`", shown(path))
    }
}

/// A path as the caller gave it, escaped for a message: a control or invisible character, a tab
/// too, as `\u{..}` ([`monad_protocol::text::printable_name`]), so that the message reads as one
/// line and a tab in a name is not taken for spaces.
pub(crate) fn shown(path: &str) -> std::borrow::Cow<'_, str> {
    monad_protocol::text::printable_name(path)
}

impl SandboxError {
    /// The wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            // Inside the workspace, but not a file it opens.
            SandboxError::Escape {
                reason: EscapeReason::SpecialFile,
                ..
            } => ErrorCode::WrongFileType,
            SandboxError::Escape { .. } => ErrorCode::OutsideWorkspace,
            SandboxError::InvalidPath { .. }
            | SandboxError::InvalidArguments(_)
            | SandboxError::Unspellable(_) => ErrorCode::InvalidArguments,
            SandboxError::NotFound(_) => ErrorCode::NotFound,
            SandboxError::WrongFileType { .. } | SandboxError::LinkLoop(_) => {
                ErrorCode::WrongFileType
            }
            SandboxError::NoMatch(_) => ErrorCode::NoMatch,
            SandboxError::LimitExceeded(_) => ErrorCode::LimitExceeded,
            SandboxError::SandboxUnavailable(_) => ErrorCode::SandboxUnavailable,
            SandboxError::Timeout(_) => ErrorCode::Timeout,
            SandboxError::Unapproved(_) => ErrorCode::Denied,
            SandboxError::Changed(_) => ErrorCode::Io,
            SandboxError::Protected(_) => ErrorCode::Denied,
            SandboxError::Io { .. } => ErrorCode::Io,
        }
    }

    /// The error as it travels on the wire.
    pub fn to_tool_error(&self) -> ToolError {
        ToolError::new(self.code(), self.to_string())
    }

    /// Classifies an I/O error from an operation on `path` inside the jail.
    ///
    /// cap-std reports an escape as `PermissionDenied` with no OS error code (or `EXDEV` from
    /// `openat2` with `RESOLVE_BENEATH`); both become [`SandboxError::Escape`]. `ENXIO`, which
    /// `open` returns for a socket or a device with no driver, is refused as a special file.
    pub(crate) fn from_io(op: &'static str, path: &str, err: io::Error) -> SandboxError {
        let path = path.to_owned();
        match err.raw_os_error() {
            Some(nix::libc::EXDEV) => {
                return SandboxError::Escape {
                    path,
                    reason: EscapeReason::LinkOutside,
                };
            }
            Some(nix::libc::ELOOP) => return SandboxError::LinkLoop(path),
            Some(nix::libc::ENOTDIR) => {
                return SandboxError::WrongFileType {
                    path,
                    what: "has a component that is not a directory",
                };
            }
            Some(nix::libc::EISDIR) => {
                return SandboxError::WrongFileType {
                    path,
                    what: "is a directory",
                };
            }
            // Opening a socket, or a device with no driver behind it.
            Some(nix::libc::ENXIO) => {
                return SandboxError::Escape {
                    path,
                    reason: EscapeReason::SpecialFile,
                };
            }
            _ => {}
        }
        match err.kind() {
            // A path with U+FFFD that matched no name that is not UTF-8 (`Jail::unlossy`): said,
            // rather than leaving the model to wonder whether the character was the trouble.
            // Which name on the way was missing, and whether one was looked up, is not known
            // here: the hint explains, and claims nothing.
            io::ErrorKind::NotFound if path.contains('\u{FFFD}') => {
                SandboxError::NotFound(format!(
                    "`{}` does not exist (`\u{FFFD}` stands for bytes of a name that are not \
                     UTF-8, as a listing shows them; spelled so, a path reaches such a name where \
                     one reads so)",
                    shown(&path)
                ))
            }
            // A name copied from a listing with an escape in it (`\u{40}` for a final `@`).
            io::ErrorKind::NotFound if holds_an_escape(&path) => SandboxError::NotFound(format!(
                "`{}` does not exist (in a listing, `\\u{{..}}` stands for the one character of \
                 that code point, such as `\\u{{40}}` for `@`: spell the character itself)",
                shown(&path)
            )),
            io::ErrorKind::NotFound => {
                SandboxError::NotFound(format!("`{}` does not exist", shown(&path)))
            }
            io::ErrorKind::PermissionDenied if err.raw_os_error().is_none() => {
                SandboxError::Escape {
                    path,
                    reason: EscapeReason::LinkOutside,
                }
            }
            _ => SandboxError::Io {
                op,
                path,
                source: err,
            },
        }
    }
}

/// Whether `path` holds an escape as a listing writes one: `\u{`, one to six hex digits, `}`.
fn holds_an_escape(path: &str) -> bool {
    path.match_indices("\\u{").any(|(at, _)| {
        let digits = path[at + 3..]
            .bytes()
            .take_while(u8::is_ascii_hexdigit)
            .count();
        (1..=6).contains(&digits) && path.as_bytes().get(at + 3 + digits) == Some(&b'}')
    })
}

impl From<SandboxError> for ToolError {
    fn from(err: SandboxError) -> ToolError {
        err.to_tool_error()
    }
}
