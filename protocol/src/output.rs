//! Standard output and error for the command line of both binaries, without a panic on a closed
//! pipe.
//!
//! `println!` panics when its reader went away (`monad-client call list_dir | head -1`: Rust
//! ignores SIGPIPE, so the write fails with `BrokenPipe`). Here a reader that left is the end of
//! the output: [`out`] writes nothing more and reports success, so the program finishes with its
//! own exit code; another write error (a full disk) is returned. [`err`] ignores errors: there is
//! nowhere left to report them. The [`outln!`](crate::outln) and [`errln!`](crate::errln) macros
//! format like `println!` and `eprintln!`.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once standard output's reader has gone.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to `writer` unless `closed`; a `BrokenPipe` sets `closed` and is not an error.
pub fn write_or_close(
    writer: &mut impl Write,
    closed: &AtomicBool,
    bytes: &[u8],
) -> io::Result<()> {
    if closed.load(Ordering::Relaxed) {
        return Ok(());
    }
    match writer.write_all(bytes).and_then(|()| writer.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            closed.store(true, Ordering::Relaxed);
            Ok(())
        }
        other => other,
    }
}

/// Writes `text` to standard output; a closed pipe ends the output quietly.
pub fn out(text: &str) -> io::Result<()> {
    out_bytes(text.as_bytes())
}

/// Writes `bytes` to standard output as they are; a closed pipe ends the output quietly.
pub fn out_bytes(bytes: &[u8]) -> io::Result<()> {
    write_or_close(&mut io::stdout().lock(), &STDOUT_CLOSED, bytes)
}

/// Writes `text` to standard error, ignoring failures.
pub fn err(text: &str) {
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

/// Like `println!`, through [`out`]: evaluates to `std::io::Result<()>`.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::out("\n")
    };
    ($($arg:tt)*) => {
        $crate::output::out(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// Like `eprintln!`, through [`err`].
#[macro_export]
macro_rules! errln {
    () => {
        $crate::output::err("\n")
    };
    ($($arg:tt)*) => {
        $crate::output::err(&format!("{}\n", format_args!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader is gone after `room` bytes, counting attempts.
    struct Pipe {
        room: usize,
        written: Vec<u8>,
        attempts: usize,
        error: io::ErrorKind,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.attempts += 1;
            if self.room == 0 {
                return Err(self.error.into());
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_ends_the_output_without_an_error() {
        let closed = AtomicBool::new(false);
        let mut pipe = Pipe {
            room: 4,
            written: Vec::new(),
            attempts: 0,
            error: io::ErrorKind::BrokenPipe,
        };
        write_or_close(&mut pipe, &closed, b"one\n").unwrap();
        write_or_close(&mut pipe, &closed, b"two\n").unwrap();
        assert!(closed.load(Ordering::Relaxed));
        let attempts = pipe.attempts;
        write_or_close(&mut pipe, &closed, b"three\n").unwrap();
        assert_eq!(pipe.attempts, attempts, "nothing more is written");
        assert_eq!(pipe.written, b"one\n");
    }

    #[test]
    fn other_write_errors_are_reported() {
        let closed = AtomicBool::new(false);
        let mut full = Pipe {
            room: 0,
            written: Vec::new(),
            attempts: 0,
            error: io::ErrorKind::StorageFull,
        };
        let e = write_or_close(&mut full, &closed, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(!closed.load(Ordering::Relaxed));
    }
}
