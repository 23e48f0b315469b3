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

/// Whether standard output's reader has gone (a write found the pipe closed).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
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

/// The rows of a list command, printed for a person or for a pipe: on a terminal, aligned
/// columns under a header; piped, one tab-separated line per row and no header (for `cut`,
/// `awk`, `while read`). Cells must already be safe to print ([`crate::text::printable`]
/// escapes tabs and line breaks, so a cell never splits a row). Written by hand: aligned
/// columns are a few lines, not worth a dependency; widths count characters, which is right
/// for the ids, names, times and numbers these lists hold.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per header; missing cells print empty). A tab in a cell is shown
    /// as `\t`: it would split the cell in two when piped, and break the columns on a terminal.
    pub fn row(&mut self, cells: Vec<String>) {
        let cells = cells
            .into_iter()
            .map(|c| {
                if c.contains('\t') {
                    c.replace('\t', "\\t")
                } else {
                    c
                }
            })
            .collect();
        self.rows.push(cells);
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The text: aligned with a header when `terminal`, else tab-separated without one.
    pub fn render(&self, terminal: bool) -> String {
        let cell = |row: &[String], i: usize| row.get(i).cloned().unwrap_or_default();
        let n = self.headers.len();
        let mut out = String::new();
        if !terminal {
            for row in &self.rows {
                let cells: Vec<String> = (0..n).map(|i| cell(row, i)).collect();
                out.push_str(&cells.join("\t"));
                out.push('\n');
            }
            return out;
        }
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, width) in widths.iter_mut().enumerate() {
                *width = (*width).max(cell(row, i).chars().count());
            }
        }
        let mut line = |cells: Vec<String>| {
            let mut text = String::new();
            for (i, c) in cells.iter().enumerate() {
                text.push_str(c);
                if i + 1 < n {
                    let pad = widths[i] - c.chars().count() + 2;
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(self.headers.iter().map(|h| h.to_uppercase()).collect());
        for row in &self.rows {
            line((0..n).map(|i| cell(row, i)).collect());
        }
        out
    }
}

/// `n` and the noun, singular or plural as `n` wants: `1 session`, `2 sessions`, `0 sessions`.
pub fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Whether log lines may carry colour codes: only on a terminal, and never when `NO_COLOR` is
/// set to anything but the empty string (<https://no-color.org>).
pub fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
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
    fn a_table_aligns_under_a_header_on_a_terminal_and_is_bare_tsv_when_piped() {
        let mut table = Table::new(&["id", "user", "created"]);
        table.row(vec!["a1".into(), "ana".into(), "2026-11-26".into()]);
        table.row(vec!["b22222".into(), "bo".into(), "2026-11-25".into()]);
        assert_eq!(
            table.render(true),
            "ID      USER  CREATED\na1      ana   2026-11-26\nb22222  bo    2026-11-25\n"
        );
        assert_eq!(
            table.render(false),
            "a1\tana\t2026-11-26\nb22222\tbo\t2026-11-25\n"
        );
        assert_eq!(Table::new(&["id"]).render(false), "");
        // A tab in a cell does not make another column.
        let mut tabbed = Table::new(&["id", "name"]);
        tabbed.row(vec!["a1".into(), "tab\there".into()]);
        assert_eq!(tabbed.render(false), "a1\ttab\\there\n");
        assert_eq!(tabbed.render(true), "ID  NAME\na1  tab\\there\n");
    }

    #[test]
    fn counts_say_one_thing_or_many_things() {
        assert_eq!(count(0, "session", "sessions"), "0 sessions");
        assert_eq!(count(1, "session", "sessions"), "1 session");
        assert_eq!(count(2, "process", "processes"), "2 processes");
    }

    #[test]
    fn log_colours_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colours(true, None));
        assert!(log_colours(true, Some(OsStr::new(""))));
        assert!(!log_colours(true, Some(OsStr::new("1"))));
        assert!(!log_colours(false, None));
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
