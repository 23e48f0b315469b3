//! Reading a settings file (the server's and a session's `config.toml`, the client's): what is
//! there must be a regular file of sensible size, or the error says what it is.
//!
//! `std::fs::read_to_string` takes whatever the path names: a FIFO left at `config.toml` held
//! the start for ever (its open and its read wait for a writer), and a link to `/dev/zero` read
//! until memory ran out. Here the open does not wait (`O_NONBLOCK`, which a regular file
//! ignores), the opened file's type and size are looked at before a byte is read, and the read
//! stops one byte past the bound whatever the size said (a file that grows meanwhile).

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Most bytes a settings file may hold: a thousand times what one needs, a bound on what a
/// mistaken path reads.
pub const MAX_SETTINGS_FILE_BYTES: u64 = 1 << 20;

/// The text of the settings file at `path` (links followed), `Ok(None)` when nothing is there.
/// An error of kind `InvalidInput` when it is not a regular file or holds more than
/// [`MAX_SETTINGS_FILE_BYTES`], `InvalidData` when it is not UTF-8; its message says which.
pub fn read(path: &Path) -> io::Result<Option<String>> {
    // Looked at before it is opened, so that a device (whose open may act) or a socket (whose
    // open fails with "No such device or address") is named for what it is; and again once
    // open, for what was swapped in between.
    match std::fs::metadata(path) {
        Ok(meta) => not_regular(&meta)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits() | nix::fcntl::OFlag::O_NOCTTY.bits())
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    not_regular(&meta)?;
    let too_big = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("holds more than {MAX_SETTINGS_FILE_BYTES} bytes: not a settings file"),
        )
    };
    if meta.len() > MAX_SETTINGS_FILE_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_SETTINGS_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SETTINGS_FILE_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

/// An error saying what `meta` is, unless it is a regular file.
fn not_regular(meta: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    if meta.is_file() {
        return Ok(());
    }
    let kind = meta.file_type();
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        assert_eq!(read(&path).unwrap(), None);
        std::fs::write(&path, "[server]\n").unwrap();
        assert_eq!(read(&path).unwrap().as_deref(), Some("[server]\n"));
    }

    /// A FIFO is refused at once (it held the start for ever), a directory and a device are
    /// refused, and so is a file over the bound or not UTF-8.
    #[test]
    fn what_is_not_a_settings_file_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let e = read(Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.to_string().contains("is a device, not a regular file"),
            "{e}"
        );
        let socket = dir.path().join("socket.toml");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let e = read(&socket).unwrap_err();
        assert!(e.to_string().contains("is a socket"), "{e}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_SETTINGS_FILE_BYTES as usize + 1]).unwrap();
        let e = read(&big).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
        let latin = dir.path().join("latin.toml");
        std::fs::write(&latin, b"name = \"caf\xe9\"\n").unwrap();
        let e = read(&latin).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
