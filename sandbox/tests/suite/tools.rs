//! Positive controls: the file tools do their job inside the root, with limits and clear errors.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use monad_protocol::tools::*;
use monad_protocol::{ErrorCode, ToolName};
use monad_sandbox::{Limits, Preview};
use serde_json::json;

use super::support::{Fixture, runtime};

fn read(path: &str) -> ReadFileArgs {
    ReadFileArgs {
        path: path.into(),
        offset: None,
        limit: None,
        workspace: None,
    }
}

fn search(pattern: &str) -> SearchArgs {
    SearchArgs {
        pattern: pattern.into(),
        path: None,
        glob: None,
        case_insensitive: None,
        max_results: None,
        include_hidden: None,
        context: None,
        files_only: None,
        workspace: None,
    }
}

fn write(path: &str, content: &str) -> WriteFileArgs {
    WriteFileArgs {
        path: path.into(),
        content: content.into(),
        create_parents: None,
        workspace: None,
    }
}

fn edit(path: &str, old: &str, new: &str) -> EditFileArgs {
    EditFileArgs {
        path: path.into(),
        old_string: old.into(),
        new_string: new.into(),
        replace_all: None,
        workspace: None,
    }
}

/// The text a model gets for `result` of `tool` (no workspace named).
fn rendered(tool: ToolName, result: &impl serde::Serialize) -> String {
    monad_protocol::render::text(tool, None, &serde_json::to_value(result).unwrap())
}

fn list(path: Option<&str>, depth: Option<u32>) -> ListDirArgs {
    ListDirArgs {
        path: path.map(Into::into),
        depth,
        include_hidden: None,
        workspace: None,
    }
}

fn paths(result: &ListDirResult) -> Vec<&str> {
    result.entries.iter().map(|e| e.path.as_str()).collect()
}

fn temp_leftovers(fx: &Fixture, dir: &str) -> Vec<String> {
    std::fs::read_dir(fx.root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".monad-"))
        .collect()
}

#[test]
fn read_file_returns_the_whole_small_file() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\nthree\n");
    let out = fx.sandbox.read_file(&read("a.txt")).unwrap();
    assert_eq!(out.content, "one\ntwo\nthree\n");
    assert_eq!(
        (out.start_line, out.lines, out.total_lines),
        (1, 3, Some(3))
    );
    assert_eq!(out.size, 14);
    assert!(!out.truncated && !out.binary);
}

#[test]
fn read_file_pages_by_offset_and_limit() {
    let fx = Fixture::new();
    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    fx.put("ten.txt", &text);
    let mut args = read("ten.txt");
    args.offset = Some(4);
    args.limit = Some(3);
    let out = fx.sandbox.read_file(&args).unwrap();
    assert_eq!(out.content, "line 4\nline 5\nline 6\n");
    assert_eq!(out.start_line, 4);
    assert!(out.truncated);
    assert_eq!(out.truncation, Some(Truncation::Lines));
    assert_eq!(out.next_offset, Some(7));
    args.offset = Some(8);
    let out = fx.sandbox.read_file(&args).unwrap();
    assert_eq!(out.content, "line 8\nline 9\nline 10\n");
    assert!(!out.truncated);
    assert_eq!(out.total_lines, Some(10));
    args.offset = Some(50);
    let out = fx.sandbox.read_file(&args).unwrap();
    assert_eq!(
        (out.content.as_str(), out.lines, out.total_lines),
        ("", 0, Some(10))
    );
    // Whole numbers written as `4.0` by a host's JSON are whole numbers, at the check before
    // approval and at the call (they were refused as floats, which the schema's `integer` is not).
    let floats = json!({"path": "ten.txt", "offset": 4.0, "limit": 3.0});
    fx.sandbox.check(ToolName::ReadFile, &floats).unwrap();
    let called = runtime()
        .block_on(fx.sandbox.call(ToolName::ReadFile, floats))
        .unwrap();
    assert_eq!(called["content"], "line 4\nline 5\nline 6\n");
}

#[test]
fn read_file_caps_bytes_and_says_where_to_continue() {
    let limits = Limits {
        read_max_bytes: 20,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    fx.put("long.txt", "0123456789\nabcdefghij\nKLMNOPQRST\n");
    let out = fx.sandbox.read_file(&read("long.txt")).unwrap();
    assert_eq!(out.content, "0123456789\n");
    assert!(out.truncated);
    assert_eq!(out.truncation, Some(Truncation::Bytes));
    assert_eq!(out.next_offset, Some(2));
    // One line longer than the cap: its head, then the next line.
    fx.put("one.txt", &format!("{}\nnext\n", "é".repeat(30)));
    let out = fx.sandbox.read_file(&read("one.txt")).unwrap();
    assert!(out.truncated && !out.binary);
    assert_eq!(out.content, "é".repeat(10), "cut on a character boundary");
    assert_eq!(out.next_offset, Some(2));
}

#[test]
fn read_file_reports_binary_files_without_dumping_them_and_says_why() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("bin.dat"), b"\x7fELF\0\0\x01binary").unwrap();
    let out = fx.sandbox.read_file(&read("bin.dat")).unwrap();
    assert!(out.binary);
    assert_eq!(out.content, "");
    assert!(out.size > 0);
    assert_eq!(
        out.binary_reason.as_deref(),
        Some("it has a NUL byte (at byte 4)")
    );
}

#[test]
fn read_file_decodes_latin1_and_utf16_text_and_says_so() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("latin1.txt"), b"caf\xe9\nna\xefve\n").unwrap();
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend("a\u{e9}\nb\n".encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(fx.root().join("utf16.txt"), utf16).unwrap();
    let out = fx.sandbox.read_file(&read("latin1.txt")).unwrap();
    assert!(!out.binary);
    assert_eq!(out.content, "café\nnaïve\n");
    assert_eq!(out.encoding.as_deref(), Some("windows-1252"));
    assert_eq!((out.lines, out.total_lines), (2, Some(2)));
    // Offset and limit count the decoded lines.
    let mut second = read("utf16.txt");
    second.offset = Some(2);
    second.limit = Some(1);
    let out = fx.sandbox.read_file(&second).unwrap();
    assert_eq!(out.content, "b\n");
    assert_eq!(out.encoding.as_deref(), Some("utf-16le"));
    assert_eq!(out.start_line, 2);
}

/// A decoded file whose first line is longer than the byte cap: its head, and the next line
/// after it.
#[test]
fn a_decoded_line_longer_than_the_byte_cap_shows_its_head_and_reads_on() {
    let fx = Fixture::with_limits(Limits {
        read_max_bytes: 1024,
        ..Limits::default()
    });
    let mut utf16 = vec![0xFF, 0xFE];
    let text = format!("{}\nb\n", "a".repeat(3000));
    utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(fx.root().join("long16.txt"), utf16).unwrap();
    let out = fx.sandbox.read_file(&read("long16.txt")).unwrap();
    assert_eq!(out.encoding.as_deref(), Some("utf-16le"));
    assert_eq!(out.lines, 1);
    assert!(
        !out.content.is_empty() && out.content.chars().all(|c| c == 'a'),
        "{}",
        out.content
    );
    assert_eq!(out.truncation, Some(Truncation::Bytes));
    assert_eq!(out.next_offset, Some(2));
    let mut on = read("long16.txt");
    on.offset = Some(2);
    let out = fx.sandbox.read_file(&on).unwrap();
    assert_eq!(out.content, "b\n");
    assert_eq!(
        (out.lines, out.truncated, out.next_offset),
        (1, false, None)
    );
    assert_eq!(out.total_lines, Some(2));
}

/// A file in another encoding longer than the byte cap is read on to its end, as UTF-8 text is:
/// each read decodes from the line it starts at, found in the bytes.
#[test]
fn a_file_in_another_encoding_past_the_byte_cap_is_read_on_to_its_end() {
    let fx = Fixture::with_limits(Limits {
        read_max_bytes: 1024,
        ..Limits::default()
    });
    let text: String = (1..=400)
        .map(|i| format!("ligne {i}: café crème\n"))
        .collect();
    let mut latin1: Vec<u8> = text
        .chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap())
        .collect();
    latin1.extend(b"sans fin \xe9");
    std::fs::write(fx.root().join("latin1.txt"), latin1).unwrap();
    let mut utf16be = vec![0xFE, 0xFF];
    utf16be.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
    utf16be.extend("sans fin é".encode_utf16().flat_map(u16::to_be_bytes));
    std::fs::write(fx.root().join("utf16.txt"), utf16be).unwrap();
    let whole = format!("{text}sans fin é");
    for (name, encoding) in [("latin1.txt", "windows-1252"), ("utf16.txt", "utf-16be")] {
        let mut args = read(name);
        let mut shown = String::new();
        let mut reads = 0;
        let last = loop {
            let out = fx.sandbox.read_file(&args).unwrap();
            assert_eq!(out.encoding.as_deref(), Some(encoding), "{name}");
            assert_eq!(out.start_line, args.offset.unwrap_or(1), "{name}");
            assert!(out.lines > 0, "{name}: {out:?}");
            shown.push_str(&out.content);
            reads += 1;
            assert!(reads < 100, "{name}: does not end");
            match out.next_offset {
                Some(next) => args.offset = Some(next),
                None => break out,
            }
        };
        assert_eq!(shown, whole, "{name}");
        assert!(reads > 5, "{name}: {reads} reads");
        assert_eq!(last.total_lines, Some(401), "{name}");
        assert!(!last.truncated, "{name}");
        // Past the end: nothing, and how many lines there are.
        args.offset = Some(500);
        let out = fx.sandbox.read_file(&args).unwrap();
        assert_eq!((out.content.as_str(), out.lines), ("", 0), "{name}");
        assert_eq!(out.total_lines, Some(401), "{name}");
    }
    // Each part is told by its own bytes. Plain ASCII past the cap, then UTF-8 with a stray
    // byte: UTF-8, not windows-1252 guessed from the ASCII head.
    let mut mixed = "ascii line\n".repeat(200).into_bytes();
    mixed.extend("café crème\n".as_bytes());
    mixed.extend(b"stray \xff\n");
    std::fs::write(fx.root().join("mixed.txt"), &mixed).unwrap();
    let mut on = read("mixed.txt");
    on.offset = Some(201);
    let out = fx.sandbox.read_file(&on).unwrap();
    assert_eq!(out.content, "café crème\nstray \u{fffd}\n");
    assert_eq!(out.encoding.as_deref(), Some("utf-8"));
    // Text, then binary data: the binary part is binary, said so.
    let mut tail = "text line\n".repeat(200).into_bytes();
    tail.push(0xe9);
    tail.push(b'\n');
    tail.extend([0u8, 1, 2, 3, 0, 0, 0, 7, b'\n'].repeat(50));
    std::fs::write(fx.root().join("tail.bin"), &tail).unwrap();
    let mut on = read("tail.bin");
    on.offset = Some(202);
    let out = fx.sandbox.read_file(&on).unwrap();
    assert!(out.binary, "{out:?}");
    assert!(
        out.binary_reason
            .as_deref()
            .is_some_and(|why| why.contains("from line 202")),
        "{out:?}"
    );
    // A head that holds more than ASCII tells the whole file: a line reads the same from any
    // offset (a stray byte in UTF-8 stays U+FFFD, a windows-1252 file's last line with its
    // Ctrl-Z stays text).
    let utf8 = b"na\xc3\xafve caf\xc3\xa9 r\xc3\xa9sum\xc3\xa9\n".repeat(3);
    let utf8 = [utf8, b"caf\xe9\nend\n".to_vec()].concat();
    std::fs::write(fx.root().join("stray.txt"), &utf8).unwrap();
    let whole = fx.sandbox.read_file(&read("stray.txt")).unwrap();
    let mut on = read("stray.txt");
    on.offset = Some(4);
    let part = fx.sandbox.read_file(&on).unwrap();
    assert_eq!(part.content, "caf\u{fffd}\nend\n");
    assert!(whole.content.ends_with(&part.content), "{whole:?}");
    assert_eq!(part.encoding, whole.encoding);
    let dos = [
        b"\xc9t\xe9\r\n".repeat(3),
        b"Fin de l'\xe9t\xe9\r\n\x1a".to_vec(),
    ]
    .concat();
    std::fs::write(fx.root().join("dos.txt"), &dos).unwrap();
    let mut on = read("dos.txt");
    on.offset = Some(4);
    let last = fx.sandbox.read_file(&on).unwrap();
    assert!(!last.binary, "{last:?}");
    assert_eq!(last.content, "Fin de l'été\r\n\u{1a}");
    assert_eq!(last.encoding.as_deref(), Some("windows-1252"));
    // A UTF-16 line that starts with U+FEFF keeps it when read from that line.
    let text = format!("{}\u{feff}marked\n", "line\n".repeat(300));
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(fx.root().join("marked16.txt"), utf16).unwrap();
    let mut on = read("marked16.txt");
    on.offset = Some(301);
    let out = fx.sandbox.read_file(&on).unwrap();
    assert_eq!(out.content, "\u{feff}marked\n");
}

#[test]
fn read_file_of_an_empty_file_is_empty() {
    let fx = Fixture::new();
    fx.put("empty", "");
    let out = fx.sandbox.read_file(&read("empty")).unwrap();
    assert_eq!(
        (out.content.as_str(), out.lines, out.total_lines),
        ("", 0, Some(0))
    );
}

#[test]
fn read_file_refuses_bad_arguments_and_wrong_kinds_clearly() {
    let fx = Fixture::new();
    fx.put("d/a.txt", "x");
    let mut args = read("d/a.txt");
    args.offset = Some(0);
    assert_eq!(
        fx.sandbox.read_file(&args).unwrap_err().code(),
        ErrorCode::InvalidArguments
    );
    args.offset = None;
    args.limit = Some(0);
    assert_eq!(
        fx.sandbox.read_file(&args).unwrap_err().code(),
        ErrorCode::InvalidArguments
    );
    let err = fx.sandbox.read_file(&read("d")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType);
    assert!(err.to_string().contains("is a directory"), "{err}");
    // An empty path is the root, and the message says so rather than quoting nothing.
    let err = fx.sandbox.read_file(&read("")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the workspace root (an empty path) is a directory"
    );
    let err = fx.sandbox.read_file(&read("missing.txt")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("missing.txt"), "{err}");
    let err = fx.sandbox.read_file(&read("d/a.txt/x")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType, "{err}");
}

#[test]
fn absolute_paths_inside_the_root_are_read_as_relative() {
    let fx = Fixture::new();
    fx.put("src/lib.rs", "fn main() {}\n");
    let abs = fx.root().join("src/lib.rs");
    let out = fx.sandbox.read_file(&read(abs.to_str().unwrap())).unwrap();
    assert_eq!(out.path, "src/lib.rs");
    assert_eq!(out.content, "fn main() {}\n");
}

#[test]
fn list_dir_lists_sorted_entries_with_kinds_and_hides_dotfiles() {
    let fx = Fixture::new();
    fx.put("b.txt", "");
    fx.put("a/inner.txt", "");
    fx.put(".hidden", "");
    fx.symlink("b.txt", "link");
    fx.put("a/.inner-hidden", "");
    let out = fx.sandbox.list_dir(&list(None, None)).unwrap();
    assert_eq!(out.path, ".");
    assert_eq!(paths(&out), ["a", "b.txt", "link"]);
    // What was left out for being hidden is counted, in every directory listed.
    assert_eq!(out.hidden, 1);
    assert_eq!(fx.sandbox.list_dir(&list(None, Some(2))).unwrap().hidden, 2);
    let kinds: Vec<EntryKind> = out.entries.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EntryKind::Dir, EntryKind::File, EntryKind::Symlink]);
    let mut args = list(None, Some(2));
    args.include_hidden = Some(true);
    let out = fx.sandbox.list_dir(&args).unwrap();
    assert_eq!(
        paths(&out),
        [
            ".hidden",
            "a",
            "a/.inner-hidden",
            "a/inner.txt",
            "b.txt",
            "link"
        ]
    );
    assert!(!out.truncated);
    assert_eq!(out.hidden, 0);
    let out = fx.sandbox.list_dir(&list(Some("a"), None)).unwrap();
    assert_eq!(paths(&out), ["a/inner.txt"]);
    // A file is said to be one (and a link to one too); a file on the way is a component
    // that is not a directory.
    // The check before approval says the same (it said "has a component that is not a
    // directory").
    for path in ["b.txt", "link"] {
        let err = fx.sandbox.list_dir(&list(Some(path), None)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::WrongFileType);
        assert!(
            err.to_string().contains("is a file, not a directory"),
            "{err}"
        );
        let checked = fx
            .sandbox
            .check(ToolName::ListDir, &json!({ "path": path }))
            .unwrap_err();
        assert_eq!(checked.to_string(), err.to_string());
    }
    let err = fx
        .sandbox
        .list_dir(&list(Some("b.txt/x"), None))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("has a component that is not a directory"),
        "{err}"
    );
}

#[test]
fn list_dir_reads_directories_larger_than_one_read_and_names_every_kind() {
    // Entries come through one 32 KiB `getdents64` buffer: 3,000 entries of 60-byte names
    // (about 240 KiB of records) take several reads, and the walk goes on into a subdirectory
    // with the same buffer after its parent's entries are collected.
    let fx = Fixture::new();
    let long = "n".repeat(50);
    for i in 0..3000 {
        fx.put(&format!("big/{long}_{i:04}.txt"), "");
    }
    fx.put("big/sub/deep.txt", "");
    fx.put("big/.dot", "");
    fx.fifo("big/pipe");
    std::fs::create_dir(fx.root().join("empty")).unwrap();
    // A name that is not UTF-8 is shown lossily rather than dropped.
    let odd = std::ffi::OsStr::from_bytes(b"odd_\xff");
    std::fs::write(fx.root().join("big").join(odd), "").unwrap();

    let mut args = list(Some("big"), Some(2));
    args.include_hidden = Some(true);
    let out = fx.sandbox.list_dir(&args).unwrap();
    assert!(!out.truncated);
    let mut expected: Vec<String> = vec!["big/.dot".into()];
    expected.extend((0..3000).map(|i| format!("big/{long}_{i:04}.txt")));
    expected.extend(["big/odd_\u{fffd}".into(), "big/pipe".into()]);
    expected.extend(["big/sub".into(), "big/sub/deep.txt".into()]);
    assert_eq!(paths(&out), expected);
    let kind = |p: &str| out.entries.iter().find(|e| e.path == p).unwrap().kind;
    assert_eq!(kind("big/pipe"), EntryKind::Other);
    assert_eq!(kind("big/sub"), EntryKind::Dir);
    assert_eq!(kind("big/.dot"), EntryKind::File);
    // Neither `.` nor `..` is an entry, hidden or not.
    assert!(
        out.entries
            .iter()
            .all(|e| !e.path.ends_with("/.") && !e.path.ends_with("/.."))
    );

    let out = fx.sandbox.list_dir(&list(Some("empty"), None)).unwrap();
    assert!(out.entries.is_empty() && !out.truncated);
}

#[test]
fn list_dir_truncates_at_the_entry_cap() {
    let limits = Limits {
        list_max_entries: 3,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    for i in 0..10 {
        fx.put(&format!("f{i}"), "");
    }
    let out = fx.sandbox.list_dir(&list(None, None)).unwrap();
    assert_eq!(paths(&out), ["f0", "f1", "f2"]);
    assert!(out.truncated);
    let err = fx.sandbox.list_dir(&list(None, Some(0))).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
    let err = fx.sandbox.list_dir(&list(Some("f0"), None)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType, "{err}");
}

#[test]
fn list_dir_at_the_cap_keeps_the_first_names_of_a_large_directory() {
    // A directory far larger than the cap: the listing holds at most twice the cap's entries
    // at a time, and still gives the first names in order, with what is under them.
    let limits = Limits {
        list_max_entries: 5,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    for i in (0..200).rev() {
        fx.put(&format!("big/f{i:03}"), "");
    }
    fx.put("big/a/x", "");
    fx.put("big/a/y", "");
    let out = fx.sandbox.list_dir(&list(Some("big"), None)).unwrap();
    assert_eq!(
        paths(&out),
        ["big/a", "big/f000", "big/f001", "big/f002", "big/f003"]
    );
    assert!(out.truncated);
    let out = fx.sandbox.list_dir(&list(Some("big"), Some(2))).unwrap();
    assert_eq!(
        paths(&out),
        ["big/a", "big/a/x", "big/a/y", "big/f000", "big/f001"]
    );
    assert!(out.truncated);
    // Exactly at the cap: nothing left out.
    let out = fx.sandbox.list_dir(&list(Some("big/a"), None)).unwrap();
    assert_eq!(paths(&out), ["big/a/x", "big/a/y"]);
    assert!(!out.truncated);
    for i in 0..3 {
        fx.put(&format!("five/{i}"), "");
    }
    fx.put("five/d/inner", "");
    let out = fx.sandbox.list_dir(&list(Some("five"), Some(2))).unwrap();
    assert_eq!(
        paths(&out),
        ["five/0", "five/1", "five/2", "five/d", "five/d/inner"]
    );
    assert!(!out.truncated);
    // And through `call`, on the calling task or the pool alike.
    let rt = runtime();
    let called = rt
        .block_on(fx.sandbox.call(ToolName::ListDir, json!({"path": "big"})))
        .unwrap();
    assert_eq!(called["entries"].as_array().unwrap().len(), 5);
    assert_eq!(called["truncated"], true);
}

#[test]
fn stat_describes_files_dirs_and_links() {
    let fx = Fixture::new();
    fx.put("f.txt", "12345");
    std::fs::set_permissions(
        fx.root().join("f.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    fx.symlink("f.txt", "l");
    let st = |p: &str| {
        fx.sandbox
            .stat(&StatArgs {
                path: p.into(),
                workspace: None,
            })
            .unwrap()
    };
    let f = st("f.txt");
    assert_eq!(
        (f.kind, f.size, f.mode.as_str(), f.readonly),
        (EntryKind::File, 5, "0640", false)
    );
    assert!(f.modified_unix.unwrap() > 1_600_000_000);
    assert_eq!(st(".").kind, EntryKind::Dir);
    let l = st("l");
    assert_eq!(l.kind, EntryKind::Symlink);
    assert_eq!(l.link_target.as_deref(), Some("f.txt"));
}

#[test]
fn search_finds_lines_and_honours_gitignore_hidden_and_binary() {
    let fx = Fixture::new();
    fx.put("src/a.rs", "fn alpha() {}\nlet needle = 1;\n");
    fx.put("src/b.txt", "NEEDLE in caps\n");
    fx.put(".gitignore", "target/\n*.log\n!keep.log\n");
    fx.put("target/out.rs", "needle in build output\n");
    fx.put("debug.log", "needle in a log\n");
    fx.put("keep.log", "needle kept\n");
    fx.put("sub/.gitignore", "local.rs\n");
    fx.put("sub/local.rs", "needle local\n");
    fx.put("sub/other.rs", "needle other\n");
    fx.put(".hidden/h.rs", "needle hidden\n");
    fx.put(".git/config", "needle in git\n");
    std::fs::write(fx.root().join("bin.dat"), b"needle\0\x01\x02").unwrap();
    let out = fx.sandbox.search(&search("needle")).unwrap();
    let found: Vec<(&str, u64)> = out
        .matches
        .iter()
        .map(|m| (m.path.as_str(), m.line_number))
        .collect();
    assert_eq!(
        found,
        [("keep.log", 1), ("src/a.rs", 2), ("sub/other.rs", 1)]
    );
    assert_eq!(out.matches[1].line, "let needle = 1;");
    assert!(!out.truncated);

    let mut args = search("needle");
    args.case_insensitive = Some(true);
    args.path = Some("src".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches.len(), 2);
    assert_eq!(out.files_searched, 2);

    let mut args = search("needle");
    args.include_hidden = Some(true);
    let out = fx.sandbox.search(&args).unwrap();
    assert!(out.matches.iter().any(|m| m.path == ".hidden/h.rs"));
    assert!(!out.matches.iter().any(|m| m.path.starts_with(".git/")));

    // The root's .gitignore applies when searching a subdirectory too.
    fx.put("sub/deep.log", "needle in a nested log\n");
    let mut args = search("needle");
    args.path = Some("sub".into());
    let out = fx.sandbox.search(&args).unwrap();
    let found: Vec<&str> = out.matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(found, ["sub/other.rs"]);
    // A directory named explicitly is searched even when ignored, as ripgrep does.
    args.path = Some("target".into());
    assert_eq!(fx.sandbox.search(&args).unwrap().matches.len(), 1);
}

#[test]
fn search_filters_by_glob_caps_results_and_rejects_bad_patterns() {
    let fx = Fixture::new();
    for i in 0..5 {
        fx.put(&format!("d/f{i}.rs"), "hit\nhit\n");
        fx.put(&format!("d/f{i}.md"), "hit\n");
    }
    let mut args = search("hit");
    args.glob = Some("*.md".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches.len(), 5);
    assert!(out.matches.iter().all(|m| m.path.ends_with(".md")));

    let mut args = search("hit");
    args.max_results = Some(3);
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches.len(), 3);
    assert!(out.truncated);
    assert!(
        !out.at_cap,
        "a lower `max_results` stopped it: more may be asked for"
    );

    // Past the workspace's cap, `max_results` is taken as the cap, and the result says so.
    let fx_capped = Fixture::with_limits(Limits {
        search_max_results: 4,
        ..Limits::default()
    });
    for i in 0..5 {
        fx_capped.put(&format!("d/f{i}.rs"), "hit\nhit\n");
    }
    for asked in [None, Some(4), Some(1000)] {
        let mut args = search("hit");
        args.max_results = asked;
        let out = fx_capped.sandbox.search(&args).unwrap();
        assert_eq!(out.matches.len(), 4, "{asked:?}");
        assert!(out.truncated && out.at_cap, "{asked:?}");
    }

    // A pattern whose compiled program passes 16 MiB is refused (it was compiled up to 100
    // MiB, with a lazy DFA cache of up to 1 GiB, a search, on a server every user shares).
    let large = fx.sandbox.search(&search("\\w{400}")).unwrap_err();
    assert_eq!(large.code(), ErrorCode::InvalidArguments, "{large}");
    assert!(large.to_string().contains("size limit"), "{large}");
    fx.sandbox.search(&search("\\w{20}")).unwrap();

    let err = fx.sandbox.search(&search("(unclosed")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
    assert!(err.to_string().contains("regular expression"), "{err}");
    // The error shows the pattern as given, its caret under the open parenthesis, not the
    // matcher's own wrapping of it.
    let said = err.to_string();
    assert!(!said.contains("(?:"), "{said}");
    assert!(said.contains("\n    (unclosed\n    ^\n"), "{said}");
    assert!(said.contains("unclosed group"), "{said}");
    // It repeats the pattern: a control character in it is escaped, as in every message.
    let said = fx
        .sandbox
        .search(&search("\u{1b}[2J("))
        .unwrap_err()
        .to_string();
    assert!(said.contains("\n    \\u{1b}[2J(\n"), "{said}");
    assert!(!said.contains('\u{1b}'), "{said}");
    let mut args = search("hit");
    args.glob = Some("[".into());
    assert_eq!(
        fx.sandbox.search(&args).unwrap_err().code(),
        ErrorCode::InvalidArguments
    );
}

/// `context` shows the lines around each match as grep's `-C` does (each line once where
/// they overlap, `--` between runs that do not follow each other, `max_results` counting
/// matches only, a match past it taking its lines before it along), and `files_only` names
/// each file with a match once, as `-l` does, `max_results` counting files.
#[test]
fn search_shows_lines_around_matches_and_lists_files_only() {
    let fx = Fixture::new();
    let lines: String = (1..=20)
        .map(|n| match n {
            5 | 7 | 15 => format!("hit {n}\n"),
            _ => format!("line {n}\n"),
        })
        .collect();
    fx.put("a.txt", &lines);
    fx.put("b.txt", "hit\nhit\n");
    fx.put("c.txt", "nothing\n");
    let mut args = search("hit");
    args.path = Some("a.txt".into());
    args.context = Some(1);
    let out = fx.sandbox.search(&args).unwrap();
    let seen: Vec<(u64, bool)> = out
        .matches
        .iter()
        .map(|m| (m.line_number, m.context))
        .collect();
    let (hit, around) = (false, true);
    assert_eq!(
        seen,
        [
            (4, around),
            (5, hit),
            (6, around),
            (7, hit),
            (8, around),
            (14, around),
            (15, hit),
            (16, around)
        ]
    );
    assert_eq!(out.matches[0].line, "line 4");
    let text = rendered(ToolName::Search, &out);
    assert!(
        text.starts_with("3 matches in 1 file")
            && text.contains(
                "\na.txt-4- line 4\na.txt:5: hit 5\na.txt-6- line 6\na.txt:7: hit 7\n\
                 a.txt-8- line 8\n--\na.txt-14- line 14\na.txt:15: hit 15\na.txt-16- line 16"
            ),
        "{text}"
    );

    // The cap counts matches: the third match's line before it is left out with it.
    args.max_results = Some(2);
    let out = fx.sandbox.search(&args).unwrap();
    let numbers: Vec<u64> = out.matches.iter().map(|m| m.line_number).collect();
    assert_eq!(numbers, [4, 5, 6, 7, 8]);
    assert!(out.truncated);

    args.context = Some(MAX_SEARCH_CONTEXT + 1);
    let err = fx.sandbox.search(&args).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
    assert!(err.to_string().contains("at most 10"), "{err}");

    let mut args = search("hit");
    args.files_only = Some(true);
    let out = fx.sandbox.search(&args).unwrap();
    let files: Vec<(&str, u64)> = out
        .matches
        .iter()
        .map(|m| (m.path.as_str(), m.line_number))
        .collect();
    assert_eq!(files, [("a.txt", 5), ("b.txt", 1)]);
    assert!(out.files_only && !out.truncated);
    let text = rendered(ToolName::Search, &out);
    assert!(
        text.starts_with("2 files with matches") && text.ends_with(":\na.txt\nb.txt"),
        "{text}"
    );
    args.max_results = Some(1);
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches.len(), 1);
    assert!(out.truncated);
}

#[test]
fn search_of_a_single_file_and_long_lines_are_cut() {
    let limits = Limits {
        search_max_line_chars: 10,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    fx.put("one.txt", &format!("needle{}\n", "x".repeat(100)));
    let mut args = search("needle");
    args.path = Some("one.txt".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches.len(), 1);
    assert_eq!(out.matches[0].line, "needlexxxx…");
    // A match far into a long line (a minified file) is shown with what is around it.
    fx.put(
        "min.js",
        &format!("{}NEEDLE{}\n", "a".repeat(10_000), "b".repeat(10_000)),
    );
    let mut args = search("NEEDLE");
    args.path = Some("min.js".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches[0].line, "…aaNEEDLEbb…");
    // Toward the end: cut at the start only.
    fx.put("end.js", &format!("{}é NEEDLE\n", "é".repeat(50)));
    let mut args = search("NEEDLE");
    args.path = Some("end.js".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches[0].line, "…é NEEDLE");
    // Bytes that are not UTF-8 before the match (Latin-1) do not move the window off it.
    let mut latin1 = vec![0xe9u8; 100];
    latin1.extend(b"NEEDLE");
    latin1.extend(vec![0xe8u8; 100]);
    latin1.push(b'\n');
    std::fs::write(fx.root().join("latin1.js"), latin1).unwrap();
    let mut args = search("NEEDLE");
    args.path = Some("latin1.js".into());
    let out = fx.sandbox.search(&args).unwrap();
    // Shown as `read_file` shows the file (windows-1252), not as U+FFFD.
    assert_eq!(out.matches[0].line, "…ééNEEDLEèè…");
    // A short Latin-1 line, whole: what `edit_file` will match once `read_file` decoded it.
    std::fs::write(fx.root().join("menu.txt"), b"caf\xe9 pin\n").unwrap();
    let mut args = search("pin");
    args.path = Some("menu.txt".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches[0].line, "café pin");
    // UTF-8 with a stray byte keeps its characters, the stray byte U+FFFD (as `read_file`).
    std::fs::write(fx.root().join("mixed.txt"), b"\xc3\xa9t\xc3\xa9 pin\xff\n").unwrap();
    let mut args = search("pin");
    args.path = Some("mixed.txt".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.matches[0].line, "été pin\u{fffd}");
    // The file's encoding decides how a line that is not UTF-8 is shown, not the line alone:
    // a UTF-8 file with one Latin-1 line shows it as `read_file` does (with U+FFFD), so that
    // an edit copied from either matches; a Latin-1 file's line as Latin-1.
    for (name, bytes) in [
        (
            "stray.txt",
            &b"\xc3\xa9t\xc3\xa9 \xc3\xa0\ncaf\xe9 pin\n"[..],
        ),
        ("legacy.txt", &b"caf\xe9 na\xefve\nd\xe9j\xe0 pin\n"[..]),
    ] {
        std::fs::write(fx.root().join(name), bytes).unwrap();
        let read = fx.sandbox.read_file(&read(name)).unwrap();
        let mut args = search("pin");
        args.path = Some(name.into());
        let out = fx.sandbox.search(&args).unwrap();
        assert_eq!(
            Some(out.matches[0].line.as_str()),
            read.content.lines().nth(1),
            "{name}"
        );
    }
    assert_eq!(
        fx.sandbox.read_file(&read("stray.txt")).unwrap().content,
        "été à\ncaf\u{fffd} pin\n"
    );
}

#[test]
fn glob_matches_paths_relative_to_its_base() {
    let fx = Fixture::new();
    fx.put("Cargo.toml", "");
    fx.put("src/lib.rs", "");
    fx.put("src/deep/mod.rs", "");
    fx.put("target/gen.rs", "");
    fx.put(".gitignore", "target\n");
    fx.put(".github/ci.yml", "");
    let g = |pattern: &str, path: Option<&str>| {
        fx.sandbox
            .glob(&GlobArgs {
                pattern: pattern.into(),
                path: path.map(Into::into),
                workspace: None,
            })
            .unwrap()
            .paths
    };
    assert_eq!(g("**/*.rs", None), ["src/deep/mod.rs", "src/lib.rs"]);
    assert_eq!(g("*.toml", None), ["Cargo.toml"]);
    assert_eq!(
        g("*.rs", None),
        Vec::<String>::new(),
        "`*` does not cross `/`"
    );
    assert_eq!(g("*.rs", Some("src")), ["src/lib.rs"]);
    assert_eq!(g(".github/*", None), [".github/ci.yml"]);
    // A file as `path` is matched by its name, as `find FILE -name` does; named through a link,
    // by the name of the file the link leads to (the path reported), whatever its characters.
    assert_eq!(g("*.rs", Some("src/lib.rs")), ["src/lib.rs"]);
    assert_eq!(g("*.toml", Some("src/lib.rs")), Vec::<String>::new());
    fx.put("src/xé.rs", "");
    std::os::unix::fs::symlink("xé.rs", fx.root().join("src/a")).unwrap();
    assert_eq!(g("*", Some("src/a")), ["src/xé.rs"]);
    assert_eq!(g("x*.rs", Some("src/a")), ["src/xé.rs"]);
    assert_eq!(g("a", Some("src/a")), Vec::<String>::new());
    std::fs::remove_file(fx.root().join("src/a")).unwrap();
    std::fs::remove_file(fx.root().join("src/xé.rs")).unwrap();
    // An absolute pattern inside the root (either spelling of it) is taken from the root,
    // as an absolute path is by every tool, with or without `path`.
    for root in [fx.root(), fx.root().canonicalize().unwrap()] {
        let root = root.display().to_string();
        assert_eq!(
            g(&format!("{root}/src/**/*.rs"), None),
            ["src/deep/mod.rs", "src/lib.rs"]
        );
        assert_eq!(g(&format!("{root}/src/*.rs"), Some("src")), ["src/lib.rs"]);
        assert_eq!(g(&format!("{root}/*.toml"), None), ["Cargo.toml"]);
        assert_eq!(g(&format!("{root}/.github/*"), None), [".github/ci.yml"]);
    }
    // A root whose own name holds glob characters.
    let odd = Fixture::new();
    let root = odd.root().join("proj[1]");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.rs"), "").unwrap();
    let sandbox = monad_sandbox::Sandbox::open(
        &root,
        Limits::default(),
        monad_sandbox::ExecPolicy::default(),
    )
    .unwrap();
    let found = sandbox
        .glob(&GlobArgs {
            pattern: format!("{}/*.rs", root.display()),
            path: None,
            workspace: None,
        })
        .unwrap();
    assert_eq!(found.paths, ["a.rs"]);
    // Outside it, refused with how to write it rather than matching nothing.
    for outside in ["/**/*.rs", "/etc/*.conf"] {
        let refused = fx
            .sandbox
            .glob(&GlobArgs {
                pattern: outside.into(),
                path: None,
                workspace: None,
            })
            .unwrap_err();
        assert_eq!(refused.code(), ErrorCode::InvalidArguments, "{refused}");
        assert!(refused.to_string().contains("**/*.rs"), "{refused}");
    }
}

#[test]
fn write_file_creates_replaces_and_reports_a_diff() {
    let fx = Fixture::new();
    let out = fx.sandbox.write_file(&write("new.txt", "a\nb\n")).unwrap();
    assert!(out.created);
    assert_eq!(out.bytes_written, 4);
    assert!(
        out.diff.contains("+++ b/new.txt") && out.diff.contains("+a\n"),
        "{}",
        out.diff
    );
    assert_eq!(fx.read("new.txt"), "a\nb\n");

    std::fs::set_permissions(
        fx.root().join("new.txt"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let out = fx.sandbox.write_file(&write("new.txt", "a\nc\n")).unwrap();
    assert!(!out.created);
    assert!(
        out.diff.contains("-b\n") && out.diff.contains("+c\n"),
        "{}",
        out.diff
    );
    assert_eq!(fx.read("new.txt"), "a\nc\n");
    let mode = std::fs::metadata(fx.root().join("new.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "the old mode is kept");
    assert!(temp_leftovers(&fx, ".").is_empty());
}

#[test]
fn write_file_creates_missing_parents_unless_told_not_to() {
    let fx = Fixture::new();
    fx.put("a/keep.txt", "k");
    // Without `create_parents`: the missing directories are made, and the file written.
    let out = fx.sandbox.write_file(&write("a/b/c/d.txt", "x")).unwrap();
    assert_eq!(
        out.created_dirs,
        ["a/b", "a/b/c"],
        "the result says which it made"
    );
    assert_eq!(fx.read("a/b/c/d.txt"), "x");
    let out = fx.sandbox.write_file(&write("a/b/c/e.txt", "x")).unwrap();
    assert!(out.created_dirs.is_empty());
    assert!(fx.root().join("a/b/c").is_dir());
    // `create_parents: false` keeps the old strictness: refused, nothing made.
    let mut args = write("n/m.txt", "x");
    args.create_parents = Some(false);
    let err = fx.sandbox.write_file(&args).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("create_parents"), "{err}");
    assert!(!fx.root().join("n").exists());
    args.create_parents = Some(true);
    fx.sandbox.write_file(&args).unwrap();
    assert_eq!(fx.read("n/m.txt"), "x");
}

#[test]
fn a_write_preview_names_the_directories_it_will_create() {
    let fx = Fixture::new();
    fx.put("a/keep.txt", "k");
    let args = json!({"path": "a/b/c/d.txt", "content": "x\n"});
    let preview = fx
        .sandbox
        .preview(ToolName::WriteFile, &args)
        .unwrap()
        .unwrap();
    assert_eq!(preview.creates, ["a/b", "a/b/c"]);
    assert!(preview.diff.contains("+x"), "{}", preview.diff);
    // The check agrees that it can run, and neither made anything.
    fx.sandbox.check(ToolName::WriteFile, &args).unwrap();
    assert!(!fx.root().join("a/b").exists());
    // An existing directory: nothing to create.
    let args = json!({"path": "a/new.txt", "content": "x"});
    let preview = fx
        .sandbox
        .preview(ToolName::WriteFile, &args)
        .unwrap()
        .unwrap();
    assert!(preview.creates.is_empty());
    // A file where a directory must be: refused by both, as the write would be.
    let args = json!({"path": "a/keep.txt/x/y.txt", "content": "x"});
    let err = fx.sandbox.preview(ToolName::WriteFile, &args).unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType, "{err}");
    let err = fx.sandbox.check(ToolName::WriteFile, &args).unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType, "{err}");
}

#[test]
fn a_write_names_a_file_not_a_directory_and_takes_names_up_to_the_limit() {
    let fx = Fixture::new();
    // A path ending in `/`, `/.` or `/..` names a directory: it is refused by the check, the
    // preview and the write, with nothing made (the jail's lexical resolution would otherwise
    // write `ts/dir/` as a file `ts/dir`, or `a/b/..` as a file `a`).
    for path in ["ts/dir/", "ts/dir/.", "ts/dir/.."] {
        let args = json!({"path": path, "content": "x"});
        for err in [
            fx.sandbox.write_file(&write(path, "x")).unwrap_err(),
            fx.sandbox.check(ToolName::WriteFile, &args).unwrap_err(),
            fx.sandbox.preview(ToolName::WriteFile, &args).unwrap_err(),
        ] {
            assert_eq!(err.code(), ErrorCode::WrongFileType, "{path}: {err}");
            assert!(err.to_string().contains("names a directory"), "{err}");
        }
        assert!(!fx.root().join("ts").exists(), "{path}");
    }
    fx.put("ts/f.txt", "old");
    let err = fx
        .sandbox
        .edit_file(&edit("ts/f.txt/", "old", "new"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType, "{err}");
    assert_eq!(fx.read("ts/f.txt"), "old");
    // A name of 255 bytes is written (its temporary file's name does not grow with it), and
    // replaced; one of 256 is refused before any directory is made for it.
    let longest = "m".repeat(255);
    fx.sandbox.write_file(&write(&longest, "1")).unwrap();
    fx.sandbox.write_file(&write(&longest, "2")).unwrap();
    assert_eq!(fx.read(&longest), "2");
    assert!(temp_leftovers(&fx, ".").is_empty());
    let err = fx
        .sandbox
        .write_file(&write(&format!("new/{}/f", "L".repeat(256)), "x"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    assert!(!fx.root().join("new").exists());
}

#[test]
fn a_write_creates_at_most_sixty_four_directories() {
    let fx = Fixture::new();
    let deep = |n: usize| format!("{}f.txt", "d/".repeat(n));
    let args = json!({"path": deep(65), "content": "x"});
    for err in [
        fx.sandbox.write_file(&write(&deep(65), "x")).unwrap_err(),
        fx.sandbox.check(ToolName::WriteFile, &args).unwrap_err(),
        fx.sandbox.preview(ToolName::WriteFile, &args).unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::LimitExceeded, "{err}");
        assert!(err.to_string().contains("65 new directories"), "{err}");
    }
    assert!(!fx.root().join("d").exists());
    fx.sandbox.write_file(&write(&deep(64), "x")).unwrap();
    assert_eq!(fx.read(&deep(64)), "x");
}

#[test]
fn an_approved_write_makes_only_the_directories_its_owner_was_shown() {
    let fx = Fixture::new();
    fx.put("a/keep.txt", "k");
    let preview = |args: &serde_json::Value| {
        fx.sandbox
            .preview(ToolName::WriteFile, args)
            .unwrap()
            .unwrap()
    };
    let approved = |args: &serde_json::Value, shown: Preview| {
        runtime().block_on(
            fx.sandbox
                .call_approved(ToolName::WriteFile, args.clone(), shown),
        )
    };
    let args = json!({"path": "a/b/c.txt", "content": "x"});
    let shown = preview(&args);
    assert_eq!(shown.creates, ["a/b"]);
    // The folder changes while the prompt waits: `a` goes, so the write would now make `a`
    // too. It is refused, and nothing is made.
    std::fs::remove_dir_all(fx.root().join("a")).unwrap();
    let err = approved(&args, shown).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Denied, "{err}");
    assert!(err.to_string().contains("`a/`"), "{err}");
    assert!(!fx.root().join("a").exists());
    // Approved `a` and `a/b` only (as a prompt had shown them), but `a/b/x` is missing too:
    // what was made is taken back.
    let deeper = json!({"path": "a/b/x/c.txt", "content": "x"});
    let mut shown = preview(&deeper);
    assert_eq!(shown.creates, ["a", "a/b", "a/b/x"]);
    shown.creates.pop();
    let err = approved(&deeper, shown).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Denied, "{err}");
    assert!(
        !fx.root().join("a").exists(),
        "the directories made are removed"
    );
    // As shown: written. Fewer missing than shown (made meanwhile) is fine too.
    let shown = preview(&args);
    assert_eq!(shown.creates, ["a", "a/b"]);
    std::fs::create_dir(fx.root().join("a")).unwrap();
    approved(&args, shown).unwrap();
    assert_eq!(fx.read("a/b/c.txt"), "x");
}

/// A write or an edit approved from a prompt replaces only the version of the file the prompt's
/// diff was made from: a file created, changed or deleted while the prompt waited (by its owner,
/// an editor, or a command the agent left running) is not overwritten with a change nobody saw.
#[test]
fn an_approved_write_or_edit_replaces_only_the_file_its_owner_was_shown() {
    let fx = Fixture::new();
    let approved = |tool: ToolName, args: &serde_json::Value, shown: Preview| {
        runtime().block_on(fx.sandbox.call_approved(tool, args.clone(), shown))
    };
    let preview =
        |tool: ToolName, args: &serde_json::Value| fx.sandbox.preview(tool, args).unwrap().unwrap();

    // A new file, created while the prompt waited.
    let args = json!({"path": "race.txt", "content": "agent content\n"});
    let shown = preview(ToolName::WriteFile, &args);
    assert!(shown.diff.starts_with("--- /dev/null"), "{}", shown.diff);
    fx.put("race.txt", "owner precious data\n");
    let err = approved(ToolName::WriteFile, &args, shown).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Io, "{err}");
    assert!(
        err.to_string()
            .contains("was created while its owner was being asked"),
        "{err}"
    );
    assert_eq!(fx.read("race.txt"), "owner precious data\n");

    // A file no tool read, changed while the prompt waited.
    fx.put("unread.txt", "line1\n");
    let args = json!({"path": "unread.txt", "content": "line1 agent\n"});
    let shown = preview(ToolName::WriteFile, &args);
    fx.put("unread.txt", "line1\nowner added important line\n");
    let err = approved(ToolName::WriteFile, &args, shown).unwrap_err();
    assert!(
        err.to_string().contains("was changed while its owner"),
        "{err}"
    );
    assert_eq!(fx.read("unread.txt"), "line1\nowner added important line\n");

    // Deleted while the prompt waited: not made again from a diff against what was there.
    let shown = preview(ToolName::WriteFile, &args);
    std::fs::remove_file(fx.root().join("unread.txt")).unwrap();
    let err = approved(ToolName::WriteFile, &args, shown).unwrap_err();
    assert!(
        err.to_string().contains("was deleted while its owner"),
        "{err}"
    );
    assert!(!fx.root().join("unread.txt").exists());

    // An edit, of a file changed while the prompt waited.
    fx.put("e.txt", "alpha\nbeta\n");
    let edit = json!({"path": "e.txt", "old_string": "alpha", "new_string": "ALPHA"});
    let shown = preview(ToolName::EditFile, &edit);
    fx.put("e.txt", "alpha\nbeta\ngamma\n");
    let err = approved(ToolName::EditFile, &edit, shown).unwrap_err();
    assert!(
        err.to_string().contains("was changed while its owner"),
        "{err}"
    );
    assert_eq!(fx.read("e.txt"), "alpha\nbeta\ngamma\n");

    // Unchanged: made as shown.
    let shown = preview(ToolName::EditFile, &edit);
    approved(ToolName::EditFile, &edit, shown).unwrap();
    assert_eq!(fx.read("e.txt"), "ALPHA\nbeta\ngamma\n");
    let args = json!({"path": "race.txt", "content": "agent content\n"});
    let shown = preview(ToolName::WriteFile, &args);
    approved(ToolName::WriteFile, &args, shown).unwrap();
    assert_eq!(fx.read("race.txt"), "agent content\n");
    // Only writes and edits have a preview to be approved by.
    let shown = preview(ToolName::WriteFile, &args);
    let err = approved(ToolName::ReadFile, &json!({"path": "race.txt"}), shown).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
}

/// A write or an edit of a path that is a symbolic link goes to the file it leads to, and its
/// preview says so: the diff names that file, as the result will.
#[test]
fn a_preview_through_a_symbolic_link_names_the_file_written() {
    let fx = Fixture::new();
    fx.put("docs/target.txt", "old\n");
    fx.symlink("docs/target.txt", "inlink");
    let shown = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &json!({"path": "inlink", "content": "new\n"}),
        )
        .unwrap()
        .unwrap();
    assert_eq!(shown.through_link.as_deref(), Some("docs/target.txt"));
    assert!(
        shown
            .diff
            .starts_with("--- a/docs/target.txt\n+++ b/docs/target.txt\n"),
        "{}",
        shown.diff
    );
    let edit = fx
        .sandbox
        .preview(
            ToolName::EditFile,
            &json!({"path": "inlink", "old_string": "old", "new_string": "new"}),
        )
        .unwrap()
        .unwrap();
    assert_eq!(edit.through_link.as_deref(), Some("docs/target.txt"));
    let direct = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &json!({"path": "docs/target.txt", "content": "new\n"}),
        )
        .unwrap()
        .unwrap();
    assert_eq!(direct.through_link, None);
    // A directory on the way that is a link: the write lands where it leads (it was shown as
    // the path given, `docs/pre-commit`, with no word of `.husky`), a new file, a file there,
    // and a new directory under it alike.
    fx.put(".husky/old", "x\n");
    fx.symlink(".husky", "hooks");
    for (path, lands) in [
        ("hooks/pre-commit", ".husky/pre-commit"),
        ("hooks/old", ".husky/old"),
        ("hooks/new/pre-push", ".husky/new/pre-push"),
    ] {
        let shown = fx
            .sandbox
            .preview(
                ToolName::WriteFile,
                &json!({"path": path, "content": "x\n"}),
            )
            .unwrap()
            .unwrap();
        assert_eq!(shown.through_link.as_deref(), Some(lands), "{path}");
    }
    let edit = fx
        .sandbox
        .preview(
            ToolName::EditFile,
            &json!({"path": "hooks/old", "old_string": "x", "new_string": "y"}),
        )
        .unwrap()
        .unwrap();
    assert_eq!(edit.through_link.as_deref(), Some(".husky/old"));

    // While the prompt waits, the file is moved (its inode, size and time kept) and the link
    // pointed at its new name: the approved write would go to a file the prompt did not name.
    let args = json!({"path": "inlink", "content": "new\n"});
    std::fs::rename(
        fx.root().join("docs/target.txt"),
        fx.root().join("docs/moved.txt"),
    )
    .unwrap();
    std::fs::remove_file(fx.root().join("inlink")).unwrap();
    fx.symlink("docs/moved.txt", "inlink");
    let err = runtime()
        .block_on(fx.sandbox.call_approved(ToolName::WriteFile, args, shown))
        .unwrap_err();
    assert!(
        err.to_string().contains("now leads to another file"),
        "{err}"
    );
    assert_eq!(fx.read("docs/moved.txt"), "old\n");
}

#[test]
fn a_line_longer_than_the_byte_cap_is_cut_and_the_next_line_found() {
    let limits = Limits {
        read_max_bytes: 1024,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    let long = "x".repeat(1 << 20);
    fx.put("one.min.js", &long);
    fx.put("two.log", &format!("{long}\nnext\n"));
    let out = fx.sandbox.read_file(&read("one.min.js")).unwrap();
    assert_eq!(out.content.len(), 1024);
    assert_eq!((out.lines, out.truncated), (1, true));
    assert_eq!(out.truncation, Some(Truncation::Bytes));
    // Its only line: nothing to read on to.
    assert_eq!((out.total_lines, out.next_offset), (Some(1), None));
    let out = fx.sandbox.read_file(&read("two.log")).unwrap();
    assert_eq!(out.content.len(), 1024);
    assert_eq!((out.total_lines, out.next_offset), (None, Some(2)));
    let mut on = read("two.log");
    on.offset = Some(2);
    assert_eq!(fx.sandbox.read_file(&on).unwrap().content, "next\n");
    // A line that fits the cap exactly with its line ending is not passed over.
    fx.put("exact.txt", &format!("{}\nafter\n", "y".repeat(1023)));
    let out = fx.sandbox.read_file(&read("exact.txt")).unwrap();
    assert_eq!(out.content, format!("{}\n", "y".repeat(1023)));
    fx.put("over.txt", &format!("{}\nafter\n", "y".repeat(1024)));
    let out = fx.sandbox.read_file(&read("over.txt")).unwrap();
    assert_eq!(out.content, "y".repeat(1024));
    assert_eq!(out.next_offset, Some(2));
    on.path = "over.txt".into();
    assert_eq!(fx.sandbox.read_file(&on).unwrap().content, "after\n");
    // A line longer than the scan for its end (16 MiB): the read cannot say whether anything
    // follows, so it offers the next line, and reading on says there is none.
    fx.put("huge.min.js", &"z".repeat(17 << 20));
    let out = fx.sandbox.read_file(&read("huge.min.js")).unwrap();
    assert_eq!(out.content.len(), 1024);
    assert_eq!((out.total_lines, out.next_offset), (None, Some(2)));
    on.path = "huge.min.js".into();
    let out = fx.sandbox.read_file(&on).unwrap();
    assert_eq!((out.lines, out.total_lines), (0, Some(1)));
}

#[test]
fn a_control_character_in_a_name_stays_inside_the_diff_header() {
    let fx = Fixture::new();
    let out = fx
        .sandbox
        .write_file(&write("x\n+++ b/fake", "hello\n"))
        .unwrap();
    let mut lines = out.diff.lines();
    assert_eq!(lines.next(), Some("--- /dev/null"));
    assert_eq!(lines.next(), Some("+++ b/x\\u{a}+++ b/fake"));
    assert!(out.diff.lines().filter(|l| l.starts_with("+++")).count() == 1);
}

#[test]
fn write_file_through_a_link_inside_the_root_writes_its_target() {
    let fx = Fixture::new();
    fx.put("real/target.txt", "old\n");
    fx.symlink("real/target.txt", "alias.txt");
    let out = fx.sandbox.write_file(&write("alias.txt", "new\n")).unwrap();
    assert_eq!(out.path, "real/target.txt");
    assert_eq!(fx.read("real/target.txt"), "new\n");
    assert!(
        std::fs::symlink_metadata(fx.root().join("alias.txt"))
            .unwrap()
            .is_symlink()
    );
}

#[test]
fn write_file_refuses_directories_the_root_and_oversized_content() {
    let limits = Limits {
        write_max_bytes: 8,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    fx.put("d/x", "");
    assert_eq!(
        fx.sandbox.write_file(&write("d", "x")).unwrap_err().code(),
        ErrorCode::WrongFileType
    );
    assert_eq!(
        fx.sandbox.write_file(&write(".", "x")).unwrap_err().code(),
        ErrorCode::WrongFileType
    );
    let err = fx
        .sandbox
        .write_file(&write("big", "123456789"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::LimitExceeded);
    assert!(!fx.root().join("big").exists());
}

#[test]
fn edit_file_replaces_a_unique_string_and_reports_a_diff() {
    let fx = Fixture::new();
    fx.put("m.rs", "fn a() {}\nfn b() {}\n");
    let out = fx
        .sandbox
        .edit_file(&edit("m.rs", "fn b()", "fn beta()"))
        .unwrap();
    assert_eq!(out.replacements, Some(1));
    assert!(
        out.diff.contains("-fn b() {}") && out.diff.contains("+fn beta() {}"),
        "{}",
        out.diff
    );
    assert_eq!(fx.read("m.rs"), "fn a() {}\nfn beta() {}\n");
    assert!(temp_leftovers(&fx, ".").is_empty());
}

/// Two occurrences that overlap (`}\n}` in `}\n}\n}`) are two places the agent may mean: the
/// edit is refused as ambiguous, not made at the first.
#[test]
fn edit_file_counts_overlapping_occurrences_as_ambiguous() {
    let fx = Fixture::new();
    fx.put("f.rs", "}\n}\n}\n");
    let err = fx
        .sandbox
        .edit_file(&edit("f.rs", "}\n}", "}\n// end\n}"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NoMatch);
    assert!(err.to_string().contains("2 times"), "{err}");
    assert_eq!(fx.read("f.rs"), "}\n}\n}\n");
    // In CRLF text too, where the agent's LF is matched as CRLF; and with a multi-byte
    // character at the overlap.
    fx.put("c.rs", "}\r\n}\r\n}\r\n");
    let err = fx
        .sandbox
        .edit_file(&edit("c.rs", "}\n}", "}"))
        .unwrap_err();
    assert!(err.to_string().contains("2 times"), "{err}");
    fx.put("u.txt", "éaéaé");
    let err = fx
        .sandbox
        .edit_file(&edit("u.txt", "éaé", "x"))
        .unwrap_err();
    assert!(err.to_string().contains("2 times"), "{err}");
    assert_eq!(fx.read("u.txt"), "éaéaé");
    // `replace_all` replaces what does not overlap, from the start, and says how many.
    let mut args = edit("f.rs", "}\n}", "]");
    args.replace_all = Some(true);
    let out = fx.sandbox.edit_file(&args).unwrap();
    assert_eq!(out.replacements, Some(1));
    assert_eq!(fx.read("f.rs"), "]\n}\n");
    // One occurrence is still one.
    let out = fx.sandbox.edit_file(&edit("f.rs", "]", "}")).unwrap();
    assert_eq!(out.replacements, Some(1));
}

/// An edit whose result would pass the write limit is refused before the result is made: 16
/// MiB of `a`, each replaced by 64 KiB, was a string of 1 TiB built first (the process died).
#[test]
fn an_edit_too_large_for_the_write_limit_is_refused_before_it_is_made() {
    let fx = Fixture::new();
    let big = "a".repeat(16 * 1024 * 1024);
    fx.put("f.txt", &big);
    let mut args = edit("f.txt", "a", &"b".repeat(64 * 1024));
    args.replace_all = Some(true);
    let err = fx.sandbox.edit_file(&args).unwrap_err();
    assert_eq!(err.code(), ErrorCode::LimitExceeded, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{} bytes", 16u128 * 1024 * 1024 * 64 * 1024)),
        "{err}"
    );
    // The check and the preview an owner is shown refuse it the same way.
    let value = serde_json::to_value(&args).unwrap();
    assert!(fx.sandbox.check(ToolName::EditFile, &value).is_err());
    assert!(fx.sandbox.preview(ToolName::EditFile, &value).is_err());
    assert_eq!(fx.read("f.txt").len(), big.len(), "nothing changed");
    // Within the limit it is made.
    fx.put("g.txt", "aXa");
    let mut args = edit("g.txt", "a", "bb");
    args.replace_all = Some(true);
    fx.sandbox.edit_file(&args).unwrap();
    assert_eq!(fx.read("g.txt"), "bbXbb");
}

#[test]
fn edit_file_changes_nothing_when_old_string_is_missing_or_ambiguous() {
    let fx = Fixture::new();
    fx.put("m.txt", "x = 1\nx = 1\n");
    let err = fx
        .sandbox
        .edit_file(&edit("m.txt", "y = 2", "z"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NoMatch);
    assert!(err.to_string().contains("does not occur"), "{err}");
    let err = fx
        .sandbox
        .edit_file(&edit("m.txt", "x = 1", "x = 2"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NoMatch);
    assert!(err.to_string().contains("2 times"), "{err}");
    assert_eq!(fx.read("m.txt"), "x = 1\nx = 1\n");
    let mut args = edit("m.txt", "x = 1", "x = 2");
    args.replace_all = Some(true);
    let out = fx.sandbox.edit_file(&args).unwrap();
    assert_eq!(out.replacements, Some(2));
    assert_eq!(fx.read("m.txt"), "x = 2\nx = 2\n");
    for (old, new) in [("", "a"), ("same", "same")] {
        let err = fx.sandbox.edit_file(&edit("m.txt", old, new)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArguments);
    }
    assert_eq!(
        fx.sandbox
            .edit_file(&edit("nope.txt", "a", "b"))
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
    std::fs::write(fx.root().join("bin"), b"\x00\x01\xff a").unwrap();
    assert_eq!(
        fx.sandbox
            .edit_file(&edit("bin", "a", "b"))
            .unwrap_err()
            .code(),
        ErrorCode::WrongFileType
    );
}

/// Regression: an edit's `old_string` was placed at every position it occurs, overlapping ones
/// included, each found by a comparison of the whole string: a file of one repeated character
/// and a long `old_string` of it (every position an occurrence) took time in the product of
/// the two lengths, tens of minutes of a core for 16 MiB and 64 KiB, in the check made before
/// the owner is asked. Occurrences are counted up to a bound, and said as more than it; the
/// same file with `replace_all` replaces what does not overlap, as before.
#[test]
fn an_old_string_that_occurs_everywhere_is_counted_to_a_bound() {
    let fx = Fixture::new();
    fx.put("zeros.txt", &"0".repeat(1 << 20));
    let old = "0".repeat(16 * 1024);
    let args = serde_json::json!({"path": "zeros.txt", "old_string": old, "new_string": "x"});
    for refused in [
        fx.sandbox.check(ToolName::EditFile, &args).unwrap_err(),
        fx.sandbox
            .edit_file(&edit("zeros.txt", &old, "x"))
            .unwrap_err(),
    ] {
        assert_eq!(refused.code(), ErrorCode::NoMatch, "{refused}");
        assert!(
            refused
                .to_string()
                .contains("occurs more than 1000 times in `zeros.txt` (at line 1)"),
            "{refused}"
        );
    }
    let all = EditFileArgs {
        replace_all: Some(true),
        ..edit("zeros.txt", &old, "x")
    };
    let done = fx.sandbox.edit_file(&all).unwrap();
    assert_eq!(done.replacements, Some(64));
    assert_eq!(fx.read("zeros.txt"), "x".repeat(64));
    // Not found among a million empty lines: the near miss is looked for where it can fit.
    fx.put("empty.txt", &"\n".repeat(1 << 20));
    let missing = fx
        .sandbox
        .edit_file(&edit("empty.txt", &old, "x"))
        .unwrap_err();
    assert_eq!(missing.code(), ErrorCode::NoMatch, "{missing}");
}

/// Regression: a path into a mount inside a folder on a local disk (an NFS share, a FUSE or
/// autofs mount) was looked up, opened and listed on the calling task, where a share whose
/// server went away blocks in the kernel: an attached client, whose runtime has one thread,
/// froze whole (its prompts, its other calls, its Ctrl-C). Such a path is found at the mount's
/// edge without entering it ([`monad_sandbox::Sandbox::beyond_a_mount`], which the async entry
/// points ask before any lookup), and its calls go to the blocking pool. A tmpfs mounted
/// inside the fixture stands for the share (it does not block, so what is checked is where
/// the edge is found, and that calls through it answer as everywhere else).
#[test]
fn a_path_into_a_mount_inside_the_folder_is_never_looked_up_on_the_calling_task() {
    let fx = Fixture::new();
    fx.put("here/a.txt", "a\n");
    std::fs::create_dir(fx.root().join("share")).unwrap();
    fx.symlink("share", "to-share");
    let share = fx.root().join("share");
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "monad-test", share.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "mount a tmpfs (the tests run as root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(share.clone());
    std::fs::write(share.join("b.txt"), "b\n").unwrap();
    for (path, beyond) in [
        ("share", true),
        ("share/b.txt", true),
        ("share/none/x", true),
        ("to-share/b.txt", true),
        ("here/../share", true),
        (".", false),
        ("here", false),
        ("here/a.txt", false),
        ("missing/x", false),
        ("../outside", false),
    ] {
        assert_eq!(fx.sandbox.beyond_a_mount(path), beyond, "{path}");
    }
    // Its listing is not made on the calling task; the root's is (where the root's filesystem
    // lists inline at all).
    let rt = runtime();
    let list = |path: &str| {
        let before = fx.sandbox.inline_listings();
        let listed = rt
            .block_on(fx.sandbox.call(ToolName::ListDir, json!({ "path": path })))
            .unwrap();
        (listed, fx.sandbox.inline_listings() > before)
    };
    let (listed, inline) = list("share");
    assert!(!inline, "listed on the calling task");
    assert_eq!(listed["entries"], json!(["share/b.txt"]), "{listed}");
    let (_, root_inline) = list(".");
    use nix::sys::statfs::{EXT4_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
    let kind = nix::sys::statfs::statfs(&fx.root())
        .unwrap()
        .filesystem_type();
    assert_eq!(
        root_inline,
        [
            EXT4_SUPER_MAGIC,
            XFS_SUPER_MAGIC,
            F2FS_SUPER_MAGIC,
            TMPFS_MAGIC
        ]
        .contains(&kind)
    );
    // And its reads and checks answer as everywhere else.
    let read = rt
        .block_on(
            fx.sandbox
                .call(ToolName::ReadFile, json!({"path": "share/b.txt"})),
        )
        .unwrap();
    assert_eq!(read["content"], "b\n");
    rt.block_on(
        fx.sandbox
            .check_async(ToolName::ReadFile, &json!({"path": "to-share/b.txt"})),
    )
    .unwrap();
}

/// A failed edit says where a model's `old_string` went wrong: the places of an ambiguous one,
/// read_file's line numbers copied with it, a first line found but for white space or case.
#[test]
fn a_failed_edit_says_where_old_string_went_wrong() {
    let fx = Fixture::new();
    fx.put(
        "m.rs",
        "fn a() {\n    let x = 1;\n}\nfn b() {\n    let x = 1;\n}\nfn Main() {}\n",
    );
    let message = |old: &str| {
        let err = fx.sandbox.edit_file(&edit("m.rs", old, "z")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NoMatch, "{err}");
        err.to_string()
    };
    let twice = message("    let x = 1;");
    assert!(
        twice.contains("occurs 2 times in `m.rs` (at lines 2 and 5)"),
        "{twice}"
    );
    let numbered = message("     1\tfn a() {\n     2\t    let x = 1;");
    assert!(
        numbered.contains("line numbers read_file shows"),
        "{numbered}"
    );
    let spaced = message("let x = 1; ");
    assert!(
        spaced.contains("(it is at lines 2 and 5 but for white space)"),
        "{spaced}"
    );
    let cased = message("fn main() {}");
    assert!(cased.contains("(it is at line 7 but for case)"), "{cased}");
    let follows = message("fn b() {\n    let y = 1;");
    assert!(
        follows.contains("(its first line occurs at line 4: what follows it there differs)"),
        "{follows}"
    );
    let nowhere = message("fn c() {\n}");
    assert!(
        nowhere.contains("(not even its first line occurs)"),
        "{nowhere}"
    );
    assert!(!message("fn c() {}").contains(" ("), "nothing to add");
    assert_eq!(
        fx.read("m.rs"),
        "fn a() {\n    let x = 1;\n}\nfn b() {\n    let x = 1;\n}\nfn Main() {}\n"
    );
}

#[test]
fn call_dispatches_json_and_refuses_unknown_arguments() {
    let fx = Fixture::new();
    fx.put("a.txt", "hello\n");
    let rt = runtime();
    let out = rt
        .block_on(
            fx.sandbox
                .call(ToolName::ReadFile, json!({"path": "a.txt"})),
        )
        .unwrap();
    assert_eq!(out["content"], "hello\n");
    let err = rt
        .block_on(
            fx.sandbox
                .call(ToolName::ReadFile, json!({"path": "a.txt", "bogus": 1})),
        )
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
    assert!(err.to_string().contains("bogus"), "{err}");
    let err = rt
        .block_on(fx.sandbox.call(ToolName::ReadFile, json!({"offset": 1})))
        .unwrap_err();
    assert!(err.to_string().contains("path"), "{err}");
    let err = rt
        .block_on(fx.sandbox.call(ToolName::Workspaces, json!({})))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments);
    let out = rt
        .block_on(
            fx.sandbox
                .call(ToolName::RunCommand, json!({"argv": ["echo", "hi"]})),
        )
        .unwrap();
    assert_eq!(out["stdout"], "hi\n");
}

/// `call` lists small directories of a local disk, one level deep, on the calling task, and
/// larger or deeper listings on the blocking pool; both give what `list_dir` gives and refuse
/// what it refuses.
#[test]
fn call_lists_inline_and_on_the_pool_alike() {
    use nix::sys::statfs::{EXT4_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
    let fx = Fixture::new();
    for i in 0..20 {
        fx.put(&format!("small/f{i:02}.txt"), "");
    }
    fx.put("small/sub/inner.txt", "");
    // Enough entries for the directory's size to pass the limit on any filesystem (tmpfs
    // counts 20 bytes an entry).
    let long = "n".repeat(60);
    let size = |dir: &str| std::fs::metadata(fx.root().join(dir)).unwrap().len();
    let mut i = 0;
    std::fs::create_dir(fx.root().join("large")).unwrap();
    while size("large") <= monad_sandbox::INLINE_LIST_MAX {
        assert!(i < 20_000, "the directory stays small: {}", size("large"));
        for _ in 0..500 {
            fx.put(&format!("large/{long}_{i:05}"), "");
            i += 1;
        }
    }
    assert!(size("small") <= monad_sandbox::INLINE_LIST_MAX);
    // Only where a directory's size counts its entries' bytes may a listing run inline.
    let kind = nix::sys::statfs::statfs(&fx.root())
        .unwrap()
        .filesystem_type();
    let lists_inline = [
        EXT4_SUPER_MAGIC,
        XFS_SUPER_MAGIC,
        F2FS_SUPER_MAGIC,
        TMPFS_MAGIC,
    ]
    .contains(&kind);
    if !lists_inline {
        eprintln!("NOTE: {kind:?} under the fixture lists nothing inline; only the pool runs");
    }
    let rt = runtime();
    for (path, depth, inline) in [
        ("small", 1, lists_inline),
        ("small", 2, false),
        ("large", 1, false),
        ("", 2, false),
        ("", 1, lists_inline),
    ] {
        let before = fx.sandbox.inline_listings();
        let called = rt
            .block_on(
                fx.sandbox
                    .call(ToolName::ListDir, json!({"path": path, "depth": depth})),
            )
            .unwrap();
        let ran_inline = fx.sandbox.inline_listings() > before;
        assert_eq!(ran_inline, inline, "{path:?} depth {depth}");
        let direct = fx.sandbox.list_dir(&list(Some(path), Some(depth))).unwrap();
        assert_eq!(
            called,
            serde_json::to_value(&direct).unwrap(),
            "{path} {depth}"
        );
    }
    let code = |args: serde_json::Value| {
        rt.block_on(fx.sandbox.call(ToolName::ListDir, args))
            .unwrap_err()
            .code()
    };
    std::fs::create_dir(fx.outside().join("secrets")).unwrap();
    fx.symlink(fx.outside().join("secrets"), "link");
    assert_eq!(code(json!({"path": "link"})), ErrorCode::OutsideWorkspace);
    assert_eq!(code(json!({"path": ".."})), ErrorCode::OutsideWorkspace);
    assert_eq!(code(json!({"path": "missing"})), ErrorCode::NotFound);
    assert_eq!(
        code(json!({"path": "small/f00.txt"})),
        ErrorCode::WrongFileType
    );
    assert_eq!(
        code(json!({"path": "small", "depth": 0})),
        ErrorCode::InvalidArguments
    );
}

/// `call` reads small files of a local disk on the calling task and others on the blocking
/// pool; both give what `read_file` gives, refuse what it refuses, and never hang on a FIFO.
#[test]
fn call_reads_inline_and_on_the_pool_alike() {
    let fx = Fixture::with_limits(Limits {
        read_max_bytes: 16 * 1024 * 1024,
        read_default_lines: 1_000_000,
        ..Limits::default()
    });
    let max = monad_sandbox::INLINE_READ_MAX as usize;
    let line = "0123456789abcdé\n"; // 17 bytes
    // The last is read whole by two threads.
    let sizes = [
        0,
        17,
        max - 1,
        max,
        max + 1,
        3 * 1024 * 1024,
        9 * 1024 * 1024 + 5,
    ];
    for size in sizes {
        let mut content = line.repeat(size / line.len());
        content.push_str(&"x".repeat(size - content.len()));
        let name = format!("f{size}.txt");
        fx.put(&name, &content);
        let direct = fx.sandbox.read_file(&read(&name)).unwrap();
        let rt = runtime();
        let called = rt
            .block_on(fx.sandbox.call(ToolName::ReadFile, json!({"path": name})))
            .unwrap();
        assert_eq!(
            called,
            serde_json::to_value(&direct).unwrap(),
            "size {size}"
        );
        assert!(called["content"] == content.as_str(), "size {size}");
        assert_eq!(direct.total_lines, Some(content.lines().count() as u64));
        // Windows of it too.
        let called = rt
            .block_on(fx.sandbox.call(
                ToolName::ReadFile,
                json!({"path": name, "offset": 2, "limit": 3}),
            ))
            .unwrap();
        let direct = fx
            .sandbox
            .read_file(&ReadFileArgs {
                offset: Some(2),
                limit: Some(3),
                ..read(&name)
            })
            .unwrap();
        assert_eq!(
            called,
            serde_json::to_value(&direct).unwrap(),
            "size {size}"
        );
    }
    let rt = runtime();
    let code = |args: serde_json::Value| {
        rt.block_on(fx.sandbox.call(ToolName::ReadFile, args))
            .unwrap_err()
            .code()
    };
    std::fs::write(fx.outside().join("secret.txt"), "secret\n").unwrap();
    fx.symlink(fx.outside().join("secret.txt"), "link.txt");
    assert_eq!(
        code(json!({"path": "link.txt"})),
        ErrorCode::OutsideWorkspace
    );
    assert_eq!(
        code(json!({"path": "../secret.txt"})),
        ErrorCode::OutsideWorkspace
    );
    assert_eq!(code(json!({"path": "missing.txt"})), ErrorCode::NotFound);
    assert_eq!(
        code(json!({"path": "f17.txt", "offset": 0})),
        ErrorCode::InvalidArguments
    );
    fx.fifo("pipe");
    let direct = fx.sandbox.read_file(&read("pipe")).unwrap_err().code();
    assert_eq!(code(json!({"path": "pipe"})), direct);
}

#[test]
fn directories_a_write_makes_belong_to_the_owner_of_the_folder_they_are_made_in() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return; // Only root makes things another user owns.
    }
    let fx = Fixture::new();
    fx.put("top/keep.txt", "k");
    std::os::unix::fs::chown(fx.root().join("top"), Some(65534), Some(65534)).unwrap();
    fx.sandbox.write_file(&write("top/a/b/c.txt", "x")).unwrap();
    for dir in ["top/a", "top/a/b"] {
        let meta = std::fs::metadata(fx.root().join(dir)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{dir}");
    }
    let file = std::fs::metadata(fx.root().join("top/a/b/c.txt")).unwrap();
    assert_eq!(file.uid(), 65534);
}

#[test]
fn a_write_through_a_dangling_link_is_refused_before_anyone_is_asked() {
    let fx = Fixture::new();
    fx.symlink(fx.outside().join("ghost_dir"), "ghost_out");
    fx.symlink("nowhere", "ghost_in");
    for (link, code) in [
        ("ghost_out", ErrorCode::OutsideWorkspace),
        ("ghost_in", ErrorCode::WrongFileType),
    ] {
        let path = format!("{link}/sub/new.txt");
        let args = json!({"path": path, "content": "x"});
        // The check and the preview (what a prompt would show) refuse it, as the write does.
        let err = fx.sandbox.check(ToolName::WriteFile, &args).unwrap_err();
        assert_eq!(err.code(), code, "check {link}: {err}");
        let err = fx.sandbox.preview(ToolName::WriteFile, &args).unwrap_err();
        assert_eq!(err.code(), code, "preview {link}: {err}");
        let err = fx.sandbox.write_file(&write(&path, "x")).unwrap_err();
        assert_eq!(err.code(), code, "write {link}: {err}");
    }
    assert!(!fx.outside().join("ghost_dir").exists());
    assert!(!fx.root().join("nowhere").exists());
}

#[test]
fn results_for_the_wire_are_the_json_of_results_as_trees() {
    let fx = Fixture::new();
    fx.put("src/main.rs", "fn main() {}\n");
    fx.put("src/lib.rs", "pub fn x() {}\n");
    let rt = runtime();
    let calls = [
        (ToolName::ListDir, json!({"path": "src"})),
        (ToolName::Stat, json!({"path": "src/main.rs"})),
        (ToolName::Glob, json!({"pattern": "**/*.rs"})),
        (
            ToolName::Search,
            json!({"pattern": "fn", "path": "src/main.rs"}),
        ),
        (ToolName::ProcessList, json!({})),
        (ToolName::ReadFile, json!({"path": "src/main.rs"})),
    ];
    for (tool, args) in calls {
        let tree = rt.block_on(fx.sandbox.call(tool, args.clone())).unwrap();
        let wire = rt
            .block_on(fx.sandbox.call_for_wire(tool, args, None))
            .unwrap();
        // A read stays a tree, so that a large content can go as a body; the rest are text.
        assert_eq!(wire.is_text(), tool != ToolName::ReadFile, "{tool}");
        assert_eq!(wire.into_value(), tree, "{tool}");
    }
    // A failure is the same failure.
    let missing = json!({"path": "nope"});
    let wire = rt.block_on(
        fx.sandbox
            .call_for_wire(ToolName::ListDir, missing.clone(), None),
    );
    let tree = rt.block_on(fx.sandbox.call(ToolName::ListDir, missing));
    assert_eq!(wire.unwrap_err().to_string(), tree.unwrap_err().to_string());
}

/// Calls run in parallel (an MCP host sends several at once); edits of one file each keep the
/// others' changes, whichever order they run in.
#[test]
fn edits_of_one_file_made_at_once_all_land() {
    let fx = Fixture::new();
    let lines: String = (0..32).map(|n| format!("item{n:03}\n")).collect();
    fx.put("many.txt", &lines);
    let rt = runtime();
    rt.block_on(async {
        let edits = (0..32).map(|n| {
            let sandbox = fx.sandbox.clone();
            tokio::spawn(async move {
                let args = json!({"path": "many.txt", "old_string": format!("item{n:03}\n"),
                                  "new_string": format!("DONE{n:03}\n")});
                sandbox.call(ToolName::EditFile, args).await
            })
        });
        for edit in edits.collect::<Vec<_>>() {
            edit.await.unwrap().expect("each edit finds its line");
        }
    });
    let done: String = (0..32).map(|n| format!("DONE{n:03}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(fx.root().join("many.txt")).unwrap(),
        done
    );
}

/// An agent cannot put its own program behind set-user-ID or set-group-ID bits by rewriting a
/// file that has them: a rewrite takes them away, as the kernel does for another user's write.
#[test]
fn a_rewrite_takes_away_set_user_and_group_id() {
    let fx = Fixture::new();
    for (name, mode, kept) in [("s.sh", 0o6755, 0o755), ("t.sh", 0o1750, 0o1750)] {
        fx.put(name, "#!/bin/sh\necho ok\n");
        std::fs::set_permissions(fx.root().join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
        fx.sandbox
            .edit_file(&edit(name, "ok", "mine"))
            .expect("edited");
        let now = std::fs::metadata(fx.root().join(name)).unwrap();
        assert_eq!(now.permissions().mode() & 0o7777, kept, "{name}");
        std::fs::set_permissions(fx.root().join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
        fx.sandbox
            .write_file(&write(name, "#!/bin/sh\n"))
            .expect("written");
        let now = std::fs::metadata(fx.root().join(name)).unwrap();
        assert_eq!(now.permissions().mode() & 0o7777, kept, "{name}");
    }
}

/// git runs what its config names (`core.fsmonitor`, a pager, aliases) and its hooks, outside
/// any sandbox, and `git status` does not show a change to them: the file tools never write
/// git's own files, however the path reaches them.
#[test]
fn git_s_own_files_are_never_written_by_the_file_tools() {
    let fx = Fixture::new();
    fx.put(".git/config", "[core]\n\tbare = false\n");
    fx.put(".git/hooks/README", "hooks\n");
    fx.put("sub/.git", "gitdir: ../.git\n");
    fx.symlink(".git", "to-git");
    fx.symlink(".git/config", "config-link");
    let fsmonitor = "[core]\n\tfsmonitor = \"touch /tmp/pwned; false\"\n";
    for path in [
        ".git/config",
        ".git/hooks/pre-commit",
        ".git/new-dir/x",
        "sub/.git",
        "sub/deeper/.git/config",
        "to-git/config",
        "to-git/hooks/post-checkout",
        "config-link",
        ".GIT/config",
    ] {
        let refused = fx.sandbox.write_file(&write(path, fsmonitor)).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Denied, "{path}: {refused}");
        assert!(refused.to_string().contains("git's own files"), "{refused}");
        let checked = fx
            .sandbox
            .check(
                ToolName::WriteFile,
                &json!({"path": path, "content": fsmonitor}),
            )
            .unwrap_err();
        assert_eq!(
            checked.code(),
            ErrorCode::Denied,
            "checked before asking: {path}"
        );
    }
    let refused = fx
        .sandbox
        .edit_file(&edit(".git/config", "bare = false", "bare = true"))
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Denied);
    assert_eq!(
        std::fs::read_to_string(fx.root().join(".git/config")).unwrap(),
        "[core]\n\tbare = false\n"
    );
    assert!(!fx.root().join(".git/hooks/pre-commit").exists());
    assert!(!fx.root().join(".git/new-dir").exists());
    assert!(!fx.root().join("sub/deeper").exists());
    // Files whose names only start like it are the project's own.
    for path in [
        ".gitignore",
        ".github/workflows/ci.yml",
        "src/.gitkeep",
        "git/config",
    ] {
        fx.sandbox
            .write_file(&write(path, "x\n"))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// Regression: only `.git` in ASCII case was taken for git's directory, where filesystems a
/// laptop's folder may be on take other names for it too: vfat and NTFS drop trailing dots and
/// spaces and look names up by their 8.3 short name, NTFS reads `name::$INDEX_ALLOCATION` as the
/// directory, HFS+ ignores joiners and bidi marks. On such a folder each of these was
/// `.git/config`. They are refused as git itself refuses them in a checkout; names that only
/// look alike stay the project's own.
#[test]
fn names_a_filesystem_takes_for_git_are_git_s_own_too() {
    let fx = Fixture::new();
    for path in [
        ".git./config",
        ".git . ./hooks/pre-commit",
        "GIT~1/config",
        "git~1/hooks/x",
        ".git::$INDEX_ALLOCATION/config",
        ".git:stream",
        ".g\u{200c}it/config",
        ".git\u{feff}/config",
        "\u{200e}.GIT/hooks/x",
        "sub/.git.",
    ] {
        let refused = fx.sandbox.write_file(&write(path, "x\n")).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Denied, "{path}: {refused}");
        assert!(refused.to_string().contains("git's own files"), "{refused}");
    }
    for path in [
        ".git-x/config",
        "git~2/x",
        "x.git/config",
        ".gi t/x",
        "git~1x/y",
    ] {
        fx.sandbox
            .write_file(&write(path, "x\n"))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// Edits `path` (replacing `old` with `new`, which must succeed) and reads the file back.
fn edited(fx: &Fixture, path: &str, old: &str, new: &str) -> String {
    let done = fx
        .sandbox
        .edit_file(&edit(path, old, new))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(done.replacements, Some(1));
    fx.read(path)
}

/// The lines a unified diff removes and adds, without its headers.
fn changed_lines(diff: &str) -> Vec<String> {
    diff.lines()
        .filter(|l| l.starts_with(['+', '-']) && !l.starts_with("+++") && !l.starts_with("---"))
        .map(str::to_owned)
        .collect()
}

/// A whole-file write of a file whose lines all end with CRLF keeps them, as an edit does:
/// the agent writes the LF lines read_file showed it, and its diff (and its owner's prompt)
/// shows the one line it changed, not every line. Content with a CR of its own, and a file of
/// both kinds or of LF, are written as given.
#[test]
fn a_write_of_a_crlf_file_keeps_its_line_endings() {
    let fx = Fixture::new();
    fx.put("dos.txt", "line1\r\nline2\r\nline3\r\n");
    let args = json!({"path": "dos.txt", "content": "line1\nLINE2\nline3\n"});
    let preview = fx
        .sandbox
        .preview(ToolName::WriteFile, &args)
        .unwrap()
        .unwrap();
    let changed = |diff: &str| changed_lines(diff).len();
    assert_eq!(changed(&preview.diff), 2, "{}", preview.diff);
    let wrote = fx
        .sandbox
        .write_file(&write("dos.txt", "line1\nLINE2\nline3\n"))
        .unwrap();
    assert_eq!(fx.read("dos.txt"), "line1\r\nLINE2\r\nline3\r\n");
    assert!(wrote.crlf_kept);
    assert_eq!(changed(&wrote.diff), 2, "{}", wrote.diff);
    let text = rendered(ToolName::WriteFile, &wrote);
    assert!(
        text.contains("its lines ending with CRLF as the file's did"),
        "{text}"
    );

    for (file, before, content) in [
        ("dos2.txt", "a\r\nb\r\n", "a\r\nb\nc"),
        // No line break to keep: nothing said kept.
        ("dos3.txt", "a\r\nb\r\n", "x"),
        ("mixed.txt", "a\r\nb\n", "a\nb\n"),
        ("unix.txt", "a\nb\n", "a\nc\n"),
        ("one.txt", "no break", "x\ny\n"),
    ] {
        fx.put(file, before);
        let wrote = fx.sandbox.write_file(&write(file, content)).unwrap();
        assert_eq!(fx.read(file), content, "{file}");
        assert!(!wrote.crlf_kept, "{file}");
    }
    // A new file is written as given.
    let wrote = fx.sandbox.write_file(&write("new.txt", "a\nb\n")).unwrap();
    assert_eq!(fx.read("new.txt"), "a\nb\n");
    assert!(!wrote.crlf_kept);
}

/// A UTF-8 file that starts with a byte order mark (what Windows editors and PowerShell write,
/// and what PowerShell 5 needs to read a script's non-ASCII text as UTF-8) keeps it through a
/// whole-file write of content without one, as a UTF-16 file keeps its own: the model never
/// saw it (`read_file` does not show it) and its diff shows only the lines it changed. Content
/// that starts with one is written as given, never with two; a new file gets none.
#[test]
fn a_write_of_a_utf8_file_with_a_byte_order_mark_keeps_it() {
    let fx = Fixture::new();
    let bom = "\u{feff}";
    fx.put(
        "script.ps1",
        &format!("{bom}Write-Host 'h\u{e9}'\nexit 0\n"),
    );
    let read = fx.sandbox.read_file(&read("script.ps1")).unwrap();
    let text = rendered(ToolName::ReadFile, &read);
    assert!(!text.contains(bom), "{text:?}");
    assert!(text.contains("byte order mark"), "{text}");
    assert!(text.contains("1\tWrite-Host"), "{text}");

    let content = "Write-Host 'h\u{e9}'\nexit 1\n";
    let args = json!({"path": "script.ps1", "content": content});
    let preview = fx
        .sandbox
        .preview(ToolName::WriteFile, &args)
        .unwrap()
        .unwrap();
    let changed = changed_lines;
    assert_eq!(
        changed(&preview.diff),
        ["-exit 0", "+exit 1"],
        "{}",
        preview.diff
    );
    let wrote = fx
        .sandbox
        .write_file(&write("script.ps1", content))
        .unwrap();
    assert_eq!(fx.read("script.ps1"), format!("{bom}{content}"));
    assert_eq!(wrote.bytes_written, (bom.len() + content.len()) as u64);
    assert_eq!(
        changed(&wrote.diff),
        ["-exit 0", "+exit 1"],
        "{}",
        wrote.diff
    );
    assert!(wrote.bom_kept);
    let text = rendered(ToolName::WriteFile, &wrote);
    assert!(text.contains("its byte order mark kept"), "{text}");

    // Content with a mark of its own: one mark, and nothing said.
    let wrote = fx
        .sandbox
        .write_file(&write("script.ps1", &format!("{bom}exit 2\n")))
        .unwrap();
    assert_eq!(fx.read("script.ps1"), format!("{bom}exit 2\n"));
    assert!(!wrote.bom_kept);
    // A file without a mark, and a new file, are written as given.
    fx.put("plain.txt", "a\n");
    for file in ["plain.txt", "new.txt"] {
        let wrote = fx.sandbox.write_file(&write(file, "b\n")).unwrap();
        assert_eq!(fx.read(file), "b\n", "{file}");
        assert!(!wrote.bom_kept, "{file}");
    }
    // With CRLF line endings too: both kept.
    fx.put("both.txt", &format!("{bom}a\r\nb\r\n"));
    let wrote = fx.sandbox.write_file(&write("both.txt", "a\nc\n")).unwrap();
    assert_eq!(fx.read("both.txt"), format!("{bom}a\r\nc\r\n"));
    assert!(wrote.bom_kept && wrote.crlf_kept);
}

/// Agents read and write LF; in a file whose lines all end with CRLF, an edit's LF means the
/// file's line break, and the file keeps one kind of line ending.
#[test]
fn an_edit_of_a_crlf_file_matches_and_writes_its_line_endings() {
    let fx = Fixture::new();
    fx.put("dos.txt", "line1\r\nline2\r\nline3\r\n");
    assert_eq!(
        edited(&fx, "dos.txt", "line1\nline2", "LINE1\nLINE2\nextra"),
        "LINE1\r\nLINE2\r\nextra\r\nline3\r\n",
        "LF matches CRLF"
    );
    // Given as CRLF, the same.
    assert_eq!(
        edited(&fx, "dos.txt", "extra\r\nline3", "line3"),
        "LINE1\r\nLINE2\r\nline3\r\n"
    );
    // A file with both kinds is taken as it is, and the failure says why it may not match.
    fx.put("mixed.txt", "a\r\nb\nc\r\n");
    let refused = fx
        .sandbox
        .edit_file(&edit("mixed.txt", "a\nb", "x"))
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::NoMatch);
    assert!(
        refused
            .to_string()
            .contains("some of its lines end with CRLF"),
        "{refused}"
    );
    assert_eq!(edited(&fx, "mixed.txt", "b\nc", "B\nC"), "a\r\nB\nC\r\n");
    // An LF file is untouched by any of it.
    fx.put("unix.txt", "x\ny\n");
    assert_eq!(edited(&fx, "unix.txt", "x\ny", "x\nz\nw"), "x\nz\nw\n");
}

/// A UTF-8 file with a stray byte reads as the UTF-8 it is (the stray byte as U+FFFD), not as
/// Latin-1, whose every character beyond ASCII would be two or three wrong ones.
#[test]
fn a_utf8_file_with_a_stray_byte_reads_as_utf8() {
    let fx = Fixture::new();
    let mut bytes = "# 日本語のコメント\nprint(\"héllo\")\n# stray: "
        .as_bytes()
        .to_vec();
    bytes.extend(b"\xff\n");
    std::fs::write(fx.root().join("mostly.py"), &bytes).unwrap();
    let whole = fx.sandbox.read_file(&read("mostly.py")).unwrap();
    assert_eq!(whole.encoding.as_deref(), Some("utf-8"));
    assert_eq!(
        whole.content,
        "# 日本語のコメント\nprint(\"héllo\")\n# stray: \u{fffd}\n"
    );
    let text = rendered(ToolName::ReadFile, &whole);
    assert!(
        text.starts_with("mostly.py: UTF-8 text with bytes that are not UTF-8 (shown as \u{fffd})"),
        "{text}"
    );
}

/// A directory below the listed one that its user cannot read (a build container's, owned by
/// root) is named as such, and the rest is listed: it failed the whole listing, blaming the
/// root. Run as an ordinary user, whom file modes bind.
#[test]
fn a_listing_names_a_directory_it_cannot_read_and_lists_the_rest() {
    super::support::as_ordinary_user("suite::tools::own_process_unreadable_listing");
}

#[test]
#[ignore = "run by a_listing_names_a_directory_it_cannot_read_and_lists_the_rest"]
fn own_process_unreadable_listing() {
    if !super::support::is_ordinary_users_own_process() {
        return;
    }
    let fx = Fixture::new();
    fx.put("open/a.txt", "a\n");
    fx.put("secret/s.txt", "s\n");
    fx.put("z.txt", "z\n");
    let secret = fx.root().join("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let listed = fx.sandbox.list_dir(&list(None, Some(3)));
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let listed = listed.expect("the rest is listed");
    let paths: Vec<&str> = listed.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["open", "open/a.txt", "secret", "z.txt"]);
    assert_eq!(listed.unreadable, ["secret/"]);
    let text = rendered(ToolName::ListDir, &listed);
    assert!(
        text.ends_with("\n(could not read the entries of secret/: no permission)"),
        "{text}"
    );
}

/// `search` given a link to a file searches the file it leads to inside the root, as
/// `read_file` reads it; a link out of the root is refused.
#[test]
fn search_through_a_link_to_a_file_searches_that_file() {
    let fx = Fixture::new();
    fx.put("real.txt", "one\nneedle two\n");
    fx.symlink("real.txt", "inlink");
    let mut args = search("needle");
    args.path = Some("inlink".into());
    let out = fx.sandbox.search(&args).unwrap();
    assert_eq!(out.files_searched, 1);
    assert_eq!(out.matches.len(), 1);
    assert_eq!(
        (out.matches[0].path.as_str(), out.matches[0].line_number),
        ("real.txt", 2)
    );
    fx.symlink(fx.root().join("../outside/secret.txt"), "outlink");
    let mut args = search("e");
    args.path = Some("outlink".into());
    let refused = fx.sandbox.search(&args).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::OutsideWorkspace, "{refused}");
}

/// A text file with a NUL byte far in (a log that caught binary data): ripgrep's binary
/// detection stops its search there, and the result says so rather than answering "no matches"
/// for the whole file. One that starts with binary data is not searched, and counted: a search
/// of a binary file by name answered "No matches (searched 1 file)" as if it had been.
#[test]
fn a_search_that_stops_at_a_late_nul_says_so() {
    let fx = Fixture::new();
    let mut late = "line\n".repeat(4_000).into_bytes();
    late.extend(b"\0junk\nneedle after\n");
    std::fs::write(fx.root().join("late.log"), &late).unwrap();
    std::fs::write(fx.root().join("early.bin"), b"\0\x01needle\n").unwrap();
    let out = fx.sandbox.search(&search("needle")).unwrap();
    assert!(out.matches.is_empty());
    assert_eq!(out.stopped_at_binary, ["late.log"]);
    assert!(!fx.sandbox.read_file(&read("late.log")).unwrap().binary);
    assert_eq!(out.binary_skipped, 1);
    // A match before the NUL, in the same stretch the searcher reads at once, is found.
    let mut early_match = b"needle first\n".to_vec();
    early_match.extend("line\n".repeat(4_000).as_bytes());
    early_match.extend(b"\0junk\n");
    std::fs::write(fx.root().join("late.log"), &early_match).unwrap();
    let found = fx.sandbox.search(&search("needle")).unwrap();
    assert_eq!(found.matches.len(), 1, "{found:?}");
    let text = rendered(ToolName::Search, &out);
    assert!(
        text.starts_with("No matches (searched 2 files, of which 1 file skipped as binary)."),
        "{text}"
    );
    assert!(
        text.ends_with(
            "\n(the search of late.log stopped at a NUL byte past its start: what follows it \
             was not searched; read_file shows it)"
        ),
        "{text}"
    );
}

/// A file its user may not write (read-only, or another user's) is not replaced by a write or an
/// edit, as a rename over it would: run as an ordinary user, whom file modes bind.
#[test]
fn a_file_its_user_may_not_write_is_not_replaced() {
    super::support::as_ordinary_user("suite::tools::own_process_read_only_file");
}

#[test]
#[ignore = "run by a_file_its_user_may_not_write_is_not_replaced"]
fn own_process_read_only_file() {
    if !super::support::is_ordinary_users_own_process() {
        return;
    }
    let fx = Fixture::new();
    fx.put("locked.txt", "keep\n");
    fx.put("open.txt", "change\n");
    let locked = fx.root().join("locked.txt");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o444)).unwrap();
    let refused = fx
        .sandbox
        .write_file(&write("locked.txt", "gone\n"))
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Denied, "{refused}");
    assert!(refused.to_string().contains("mode 0444"), "{refused}");
    let refused = fx
        .sandbox
        .edit_file(&edit("locked.txt", "keep", "gone"))
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Denied, "{refused}");
    assert_eq!(fx.read("locked.txt"), "keep\n");
    assert_eq!(edited(&fx, "open.txt", "change", "changed"), "changed\n");
}

/// Regression: a UTF-16 file with bytes that are no UTF-16 (the odd `\n` byte `echo >> file`
/// appends, a lone surrogate) read as U+FFFD there, in the old text and the new alike, so an
/// edit elsewhere wrote U+FFFD's bytes in their place while the diff showed no change there and
/// the note said only that the file stays UTF-16. The note says how many bytes change.
#[test]
fn a_preview_says_which_bytes_of_a_utf16_file_are_no_utf16() {
    let fx = Fixture::new();
    let mut bytes: Vec<u8> = vec![0xFF, 0xFE];
    bytes.extend("one\ntwo\n".encode_utf16().flat_map(u16::to_le_bytes));
    bytes.push(b'\n');
    std::fs::write(fx.root().join("w.txt"), &bytes).unwrap();
    let preview = fx
        .sandbox
        .preview(
            ToolName::EditFile,
            &serde_json::json!({"path": "w.txt", "old_string": "one", "new_string": "1"}),
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        preview.bytes_note.as_deref(),
        Some(
            "the file is utf-16le text, and is written as utf-16le; 1 of its bytes are not \
             utf-16le (shown as U+FFFD) and are written as U+FFFD's bytes"
        )
    );
    // A lone surrogate: two bytes.
    let mut lone: Vec<u8> = vec![0xFF, 0xFE];
    lone.extend("a".encode_utf16().flat_map(u16::to_le_bytes));
    lone.extend([0x00, 0xD8]);
    std::fs::write(fx.root().join("s.txt"), &lone).unwrap();
    let note = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &serde_json::json!({"path": "s.txt", "content": "b"}),
        )
        .unwrap()
        .unwrap()
        .bytes_note
        .unwrap();
    assert!(note.contains("; 2 of its bytes are not utf-16le"), "{note}");
    // Whole UTF-16 says nothing of it.
    let whole: Vec<u8> = "x\n".encode_utf16().flat_map(u16::to_le_bytes).collect();
    std::fs::write(
        fx.root().join("ok.txt"),
        [&[0xFF, 0xFE][..], &whole].concat(),
    )
    .unwrap();
    let note = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &serde_json::json!({"path": "ok.txt", "content": "y\n"}),
        )
        .unwrap()
        .unwrap()
        .bytes_note;
    assert_eq!(
        note.as_deref(),
        Some("the file is utf-16le text, and is written as utf-16le")
    );
}

/// The preview an owner approves says what its diff, made of decoded text, cannot show: a
/// file kept in its encoding or written anew as UTF-8, and bytes that are not text replaced.
/// (Before, a write of `é é \u{fffd}` over `é é \xff` showed an empty diff, and one that turned
/// a windows-1252 file into UTF-8 showed only the lines changed.)
#[test]
fn a_preview_says_what_its_diff_cannot_show_about_the_bytes() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("latin1.txt"), b"caf\xe9\n").unwrap();
    std::fs::write(fx.root().join("stray.txt"), b"\xc3\xa9 \xc3\xa9 \xff\n").unwrap();
    fx.put("plain.txt", "café\n");
    let note = |tool: ToolName, args: serde_json::Value| {
        fx.sandbox
            .preview(tool, &args)
            .unwrap()
            .expect("a preview")
            .bytes_note
    };
    let note_of = |path: &str, content: &str| {
        note(
            ToolName::WriteFile,
            serde_json::json!({"path": path, "content": content}),
        )
    };
    assert_eq!(
        note_of("latin1.txt", "cafe\n").as_deref(),
        Some("the file is windows-1252 text, and is written as windows-1252")
    );
    let anew = note_of("latin1.txt", "café ✓\n").unwrap();
    assert!(
        anew.contains("the whole file is written as UTF-8"),
        "{anew}"
    );
    let preview = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &serde_json::json!({"path": "stray.txt", "content": "é é \u{fffd}\n"}),
        )
        .unwrap()
        .unwrap();
    assert!(
        !preview.diff.contains("\n-"),
        "the text looks the same: {}",
        preview.diff
    );
    assert_eq!(
        preview.bytes_note.as_deref(),
        Some(
            "the file holds 1 bytes that are not UTF-8 text (shown in the diff as U+FFFD): \
             the write replaces them with the new text's UTF-8"
        )
    );
    // An edit keeps the encoding it can, and says so; one of such a file is refused anyway.
    let edited = note(
        ToolName::EditFile,
        serde_json::json!({"path": "latin1.txt", "old_string": "caf", "new_string": "kaf"}),
    );
    assert_eq!(
        edited.as_deref(),
        Some("the file is windows-1252 text, and is written as windows-1252")
    );
    assert_eq!(note_of("plain.txt", "cafe\n"), None, "UTF-8 says nothing");
    assert_eq!(note_of("new.txt", "x"), None, "nor a new file");
}

/// A Latin-1 or UTF-16 file stays in its encoding when written or edited (it was rewritten as
/// UTF-8, and its diff showed the old bytes as garbage); an edit it cannot hold is refused, and
/// a write it cannot hold says the file is UTF-8 now.
#[test]
fn writes_and_edits_keep_a_file_s_encoding() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("latin1.txt"), b"caf\xe9\nna\xefve\n").unwrap();
    let done = fx
        .sandbox
        .edit_file(&edit("latin1.txt", "naïve", "crème"))
        .expect("edited as the text it holds");
    assert_eq!(done.encoding.as_deref(), Some("windows-1252"));
    assert!(done.diff.contains("-naïve\n+crème"), "{}", done.diff);
    assert_eq!(
        std::fs::read(fx.root().join("latin1.txt")).unwrap(),
        b"caf\xe9\ncr\xe8me\n"
    );
    let refused = fx
        .sandbox
        .edit_file(&edit("latin1.txt", "crème", "日本"))
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InvalidArguments);
    assert!(
        refused.to_string().contains("windows-1252 text"),
        "{refused}"
    );
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend("hé\n".encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(fx.root().join("utf16.txt"), &utf16).unwrap();
    let done = fx
        .sandbox
        .write_file(&write("utf16.txt", "hé là\n"))
        .unwrap();
    assert_eq!(done.encoding.as_deref(), Some("utf-16le"));
    assert!(done.diff.contains("-hé\n+hé là"), "{}", done.diff);
    let mut want = vec![0xFF, 0xFE];
    want.extend("hé là\n".encode_utf16().flat_map(u16::to_le_bytes));
    assert_eq!(std::fs::read(fx.root().join("utf16.txt")).unwrap(), want);
    // The five bytes windows-1252 leaves undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D) go back as
    // they came: an edit elsewhere in the file is made, and they are kept.
    std::fs::write(
        fx.root().join("odd.txt"),
        b"a\x81b\x8d\x8f\x90\x9d caf\xe9\n",
    )
    .unwrap();
    let done = fx
        .sandbox
        .edit_file(&edit("odd.txt", "café", "thé"))
        .expect("edited, the undefined bytes kept");
    assert_eq!(done.encoding.as_deref(), Some("windows-1252"));
    assert_eq!(
        std::fs::read(fx.root().join("odd.txt")).unwrap(),
        b"a\x81b\x8d\x8f\x90\x9d th\xe9\n"
    );
    // Content windows-1252 cannot hold: the file becomes UTF-8, and the result says so.
    let done = fx
        .sandbox
        .write_file(&write("latin1.txt", "日本\n"))
        .unwrap();
    assert_eq!(
        (done.encoding.as_deref(), done.reencoded_from.as_deref()),
        (None, Some("windows-1252"))
    );
    assert_eq!(fx.read("latin1.txt"), "日本\n");
    let text = rendered(ToolName::WriteFile, &done);
    assert!(
        text.starts_with(
            "Wrote latin1.txt (7 bytes), in UTF-8: the file was windows-1252, which cannot hold"
        ),
        "{text}"
    );
}

/// UTF-16 without a byte order mark whose text is all ASCII is valid UTF-8 too (`h\0i\0`):
/// read as UTF-16, it is edited and written as UTF-16 as well. (Edits matched nothing, since
/// they searched the bytes with their NULs, and a write made the file UTF-8 without a word.)
#[test]
fn ascii_text_in_utf16_without_a_mark_is_edited_and_written_as_utf16() {
    let fx = Fixture::new();
    let le = |text: &str| -> Vec<u8> { text.encode_utf16().flat_map(u16::to_le_bytes).collect() };
    std::fs::write(fx.root().join("w.txt"), le("hi there\r\nbye\r\n")).unwrap();
    let read = fx.sandbox.read_file(&read("w.txt")).unwrap();
    assert_eq!(read.content, "hi there\r\nbye\r\n");
    assert_eq!(read.encoding.as_deref(), Some("utf-16le"));
    let done = fx
        .sandbox
        .edit_file(&edit("w.txt", "hi there", "ho there"))
        .expect("edited as the text it holds");
    assert_eq!(done.encoding.as_deref(), Some("utf-16le"));
    assert!(
        done.diff.contains("-hi there")
            && done.diff.contains("+ho there")
            && !done.diff.contains('\0'),
        "{:?}",
        done.diff
    );
    assert_eq!(
        std::fs::read(fx.root().join("w.txt")).unwrap(),
        le("ho there\r\nbye\r\n")
    );
    let done = fx.sandbox.write_file(&write("w.txt", "new\r\n")).unwrap();
    assert_eq!(
        (done.encoding.as_deref(), done.reencoded_from.as_deref()),
        (Some("utf-16le"), None)
    );
    assert!(!done.diff.contains('\0'), "{:?}", done.diff);
    assert_eq!(
        std::fs::read(fx.root().join("w.txt")).unwrap(),
        le("new\r\n")
    );
}

/// Regression: the write limit was checked on the new text as UTF-8, then the text was written
/// in the file's own encoding: a UTF-16 file took twice `write_max_bytes` (and its next edit
/// was refused). The limit counts the bytes written.
#[test]
fn a_write_in_utf16_counts_the_bytes_it_writes_against_the_limit() {
    let fx = Fixture::with_limits(Limits {
        write_max_bytes: 1_000,
        ..Limits::default()
    });
    let le = |text: &str| -> Vec<u8> { text.encode_utf16().flat_map(u16::to_le_bytes).collect() };
    let before = le("\u{feff}small\n");
    std::fs::write(fx.root().join("w.txt"), &before).unwrap();
    fx.sandbox.read_file(&read("w.txt")).unwrap();
    let text = format!("{}\n", "a".repeat(599));
    // Refused before its owner would be asked too (the preview an approval shows).
    let previewed = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &serde_json::json!({"path": "w.txt", "content": text}),
        )
        .unwrap_err();
    assert!(previewed.to_string().contains("write limit"), "{previewed}");
    let refused = fx.sandbox.write_file(&write("w.txt", &text)).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("written as utf-16le (the file's encoding), the content is 1202 bytes"),
        "says why the text counts twice: {refused}"
    );
    assert_eq!(std::fs::read(fx.root().join("w.txt")).unwrap(), before);
    // An edit that would take it past the limit in UTF-16 too.
    let refused = fx
        .sandbox
        .edit_file(&edit("w.txt", "small", &"b".repeat(590)))
        .unwrap_err();
    assert!(
        refused.to_string().contains("the edited file would be")
            && refused.to_string().contains("write limit"),
        "{refused}"
    );
    assert_eq!(std::fs::read(fx.root().join("w.txt")).unwrap(), before);
    // What fits is written.
    fx.sandbox.write_file(&write("w.txt", "ok\n")).unwrap();
}

/// Regression: a write or an edit of a windows-1252 file was refused when its text, in UTF-8,
/// was over the write limit, though the bytes it writes in the file's encoding (one a
/// character) were within it. The limit counts the bytes written; content no encoding could
/// bring under it is still refused before anything is looked at.
#[test]
fn a_write_in_windows_1252_that_fits_in_its_bytes_is_written() {
    let fx = Fixture::with_limits(Limits {
        write_max_bytes: 1_000,
        ..Limits::default()
    });
    // "café" in windows-1252: é is one byte there, two in UTF-8.
    std::fs::write(fx.root().join("l.txt"), b"caf\xe9\n").unwrap();
    fx.sandbox.read_file(&read("l.txt")).unwrap();
    let text = format!("{}\n", "\u{e9}".repeat(700)); // 1,401 bytes of UTF-8, 701 written
    let args = serde_json::json!({"path": "l.txt", "content": text});
    fx.sandbox.check(ToolName::WriteFile, &args).unwrap();
    fx.sandbox.preview(ToolName::WriteFile, &args).unwrap();
    let written = fx.sandbox.write_file(&write("l.txt", &text)).unwrap();
    assert_eq!(written.bytes_written, 701);
    assert_eq!(written.encoding.as_deref(), Some("windows-1252"));
    assert_eq!(std::fs::read(fx.root().join("l.txt")).unwrap().len(), 701);
    // An edit to 950 bytes in the file (1,649 of UTF-8).
    let edited = fx
        .sandbox
        .edit_file(&edit("l.txt", "\n", &format!("{}\n", "\u{e9}".repeat(249))))
        .unwrap();
    assert_eq!(edited.bytes_written, 950);
    // Past the limit in its own bytes, refused, and the file kept.
    let over = format!("{}\n", "\u{e9}".repeat(1_000));
    let refused = fx.sandbox.write_file(&write("l.txt", &over)).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("written as windows-1252 (the file's encoding), the content is 1001 bytes"),
        "{refused}"
    );
    assert_eq!(std::fs::read(fx.root().join("l.txt")).unwrap().len(), 950);
    // A new file is UTF-8: the same text is over the limit there, refused before asking.
    let new = serde_json::json!({"path": "new.txt", "content": text});
    let refused = fx.sandbox.check(ToolName::WriteFile, &new).unwrap_err();
    assert!(
        refused.to_string().contains("content is 1401 bytes"),
        "{refused}"
    );
    assert!(fx.sandbox.write_file(&write("new.txt", &text)).is_err());
    assert!(!fx.root().join("new.txt").exists());
    // And content no encoding could bring under it, before anything is looked at.
    let huge = "a".repeat(3_001);
    let refused = fx.sandbox.write_file(&write("l.txt", &huge)).unwrap_err();
    assert!(
        refused.to_string().contains("content is 3001 bytes"),
        "{refused}"
    );
}

/// Regression: UTF-16 without a byte-order mark, of characters in ASCII's range (a log, a CSV
/// export), read from its first line, was UTF-16; read on from any other line, its part was
/// guessed again as if the head were plain ASCII, and its NULs made it binary. Its head tells
/// its encoding, from any line.
#[test]
fn utf16_without_a_byte_order_mark_reads_on_from_any_line() {
    let fx = Fixture::new();
    let text: String = (1..=50).map(|i| format!("line {i}\r\n")).collect();
    let le: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
    std::fs::write(fx.root().join("log.txt"), &le).unwrap();
    let whole = fx.sandbox.read_file(&read("log.txt")).unwrap();
    assert_eq!(whole.encoding.as_deref(), Some("utf-16le"));
    let on = fx
        .sandbox
        .read_file(&ReadFileArgs {
            offset: Some(49),
            ..read("log.txt")
        })
        .unwrap();
    assert!(!on.binary, "{:?}", on.binary_reason);
    assert_eq!(on.encoding.as_deref(), Some("utf-16le"));
    assert_eq!(on.content, "line 49\r\nline 50\r\n");
    assert_eq!(on.start_line, 49);
}

/// A `write_file` replaces a file with what the agent made of what it read. When something else
/// changed the file since (a command the agent ran, an editor, the folder's owner), that change
/// would be lost unseen: the write is refused, before anyone is asked, until the file is read
/// again. A file never read is written as before, and the tools' own writes and edits count as
/// seeing the file.
#[test]
fn a_write_of_a_file_changed_since_it_was_read_is_refused() {
    let fx = Fixture::new();
    fx.put("f.txt", "one\n");
    let rt = runtime();
    // Never read: written.
    fx.sandbox.write_file(&write("f.txt", "two\n")).unwrap();
    // Read through the async path an attached folder uses, then changed by a command.
    rt.block_on(
        fx.sandbox
            .call(ToolName::ReadFile, json!({"path": "f.txt"})),
    )
    .unwrap();
    let ran = rt
        .block_on(fx.sandbox.call(
            ToolName::RunCommand,
            json!({"argv": ["sh", "-c", "echo formatted >> f.txt"]}),
        ))
        .unwrap();
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let refused = fx
        .sandbox
        .write_file(&write("f.txt", "mine\n"))
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Io, "{refused}");
    assert!(
        refused.to_string().contains("changed") && refused.to_string().contains("read it again"),
        "{refused}"
    );
    // Refused at the check too, so that its owner is not asked about it.
    let previewed = fx
        .sandbox
        .preview(
            ToolName::WriteFile,
            &json!({"path": "f.txt", "content": "mine\n"}),
        )
        .unwrap_err();
    assert_eq!(previewed.to_string(), refused.to_string());
    assert_eq!(fx.read("f.txt"), "two\nformatted\n");
    // An edit matches what is there now: it goes through, and counts as seeing the file.
    fx.sandbox
        .edit_file(&edit("f.txt", "formatted", "edited"))
        .unwrap();
    fx.sandbox.write_file(&write("f.txt", "mine\n")).unwrap();
    assert_eq!(fx.read("f.txt"), "mine\n");
    // Changed by another program (an editor saving through a rename), then read again: written.
    std::fs::write(fx.root().join("f.tmp"), "theirs\n").unwrap();
    std::fs::rename(fx.root().join("f.tmp"), fx.root().join("f.txt")).unwrap();
    assert!(fx.sandbox.write_file(&write("f.txt", "lost?\n")).is_err());
    fx.sandbox.read_file(&read("f.txt")).unwrap();
    fx.sandbox
        .write_file(&write("f.txt", "theirs, and mine\n"))
        .unwrap();
    assert_eq!(fx.read("f.txt"), "theirs, and mine\n");
    // Its mode changed (a `chmod +x`), not what it holds: written.
    std::fs::set_permissions(
        fx.root().join("f.txt"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fx.sandbox
        .write_file(&write("f.txt", "#!/bin/sh\n"))
        .unwrap();
    // Removed since it was read, then made again by someone else: refused as well.
    std::fs::remove_file(fx.root().join("f.txt")).unwrap();
    std::fs::write(fx.root().join("f.txt"), "new of theirs\n").unwrap();
    assert!(fx.sandbox.write_file(&write("f.txt", "mine\n")).is_err());
    assert_eq!(fx.read("f.txt"), "new of theirs\n");
}

/// A name that is not UTF-8 is listed with U+FFFD, and the model is told what that stands for;
/// the name as shown reaches the file, for reads, edits and writes (it was "does not exist").
#[test]
fn a_name_that_is_not_utf8_is_listed_explained_and_reached_as_shown() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.root().join("odd")).unwrap();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    let file = fx.root().join("odd").join(name);
    std::fs::write(&file, "latin\n").unwrap();
    let listed = fx.sandbox.list_dir(&list(Some("odd"), None)).unwrap();
    assert_eq!(paths(&listed), ["odd/caf\u{FFFD}.txt"]);
    let text = rendered(ToolName::ListDir, &listed);
    assert!(
        text.contains("bytes of a name that are not UTF-8"),
        "{text}"
    );
    let out = fx.sandbox.read_file(&read("odd/caf\u{FFFD}.txt")).unwrap();
    assert_eq!(out.content, "latin\n");
    fx.sandbox
        .edit_file(&edit("odd/caf\u{FFFD}.txt", "latin", "edited"))
        .unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "edited\n");
    fx.sandbox
        .write_file(&write("odd/caf\u{FFFD}.txt", "written\n"))
        .unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "written\n");
    // The directory still holds that one file: nothing was made under the name as shown.
    assert_eq!(std::fs::read_dir(fx.root().join("odd")).unwrap().count(), 1);
    // Two names that read the same cannot be told apart: refused, naming what reaches them.
    std::fs::write(
        fx.root()
            .join("odd")
            .join(std::ffi::OsStr::from_bytes(b"caf\xe8.txt")),
        "",
    )
    .unwrap();
    let err = fx
        .sandbox
        .read_file(&read("odd/caf\u{FFFD}.txt"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    assert!(
        err.to_string()
            .contains("a command reaches them through a shell glob"),
        "{err}"
    );
    // So does an absolute glob pattern that starts with it (it said the pattern started outside).
    let pattern = format!("{}/odd/caf\u{FFFD}.txt/*", fx.root().display());
    let err = fx
        .sandbox
        .glob(&GlobArgs {
            pattern,
            path: None,
            workspace: None,
        })
        .unwrap_err();
    assert!(err.to_string().contains("more than one name"), "{err}");
    // A name that reads so nowhere, or under a directory that is not there: not found, saying
    // what the character stands for (and claiming nothing about which name is missing).
    for path in ["odd/n\u{FFFD}.txt", "gone/n\u{FFFD}.txt"] {
        let err = fx.sandbox.read_file(&read(path)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
        let said = err.to_string();
        assert!(
            said.contains("a path reaches such a name where one reads so"),
            "{said}"
        );
    }
    // A name copied from a listing with an escape in it: what the escape stands for.
    std::fs::write(fx.root().join("mail@"), "m").unwrap();
    let err = fx.sandbox.read_file(&read("mail\\u{40}")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("`\\u{40}` for `@`"), "{err}");
    // Text that only looks like the start of one is no escape, and is not explained as one.
    for path in ["mail\\u{zz}", "mail\\u{}", "mail\\u{1234567}", "mail\\u{40"] {
        let err = fx.sandbox.read_file(&read(path)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert_eq!(
            err.to_string(),
            format!("`{path}` does not exist"),
            "{path}"
        );
    }
}

/// A path's control characters, a tab included, are escaped where a message repeats it: a tab
/// read as spaces, or a line break splitting the message, would misname the file to the model
/// and to the person reading the message.
#[test]
fn a_path_in_a_message_is_escaped_a_tab_and_a_line_break_included() {
    let fx = Fixture::new();
    let err = fx.sandbox.read_file(&read("a\tb\nc.txt")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert_eq!(err.to_string(), "`a\\u{9}b\\u{a}c.txt` does not exist");
    let err = fx.sandbox.read_file(&read("../x\ty")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutsideWorkspace);
    assert!(
        err.to_string().starts_with("refused `../x\\u{9}y`: "),
        "{err}"
    );
    std::fs::create_dir(fx.root().join("d\tir")).unwrap();
    let err = fx.sandbox.read_file(&read("d\tir")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongFileType);
    assert!(
        err.to_string().starts_with("`d\\u{9}ir` is a directory"),
        "{err}"
    );
}

/// Regression: a search held a file's longest line whole in memory, three times over as its
/// buffer grew (a 4 GB file of one line took 11.5 GB of a server's memory); a line over
/// `SEARCH_LINE_MAX` now stops that file's search, and the result says so.
#[test]
fn a_line_too_long_to_hold_stops_its_files_search_and_says_so() {
    let fx = Fixture::new();
    let mut long = b"needle early\n".to_vec();
    long.resize(long.len() + monad_sandbox::SEARCH_LINE_MAX * 2, b'a');
    long.extend(b"\nneedle late\n");
    std::fs::write(fx.root().join("one.line"), &long).unwrap();
    std::fs::write(fx.root().join("small.txt"), "needle here\n").unwrap();
    let out = fx.sandbox.search(&search("needle")).unwrap();
    let found: Vec<(&str, u64)> = out
        .matches
        .iter()
        .map(|m| (m.path.as_str(), m.line_number))
        .collect();
    assert_eq!(found, [("one.line", 1), ("small.txt", 1)], "{out:?}");
    assert_eq!(out.stopped_at_long_line, ["one.line"]);
    let text = rendered(ToolName::Search, &out);
    assert!(
        text.ends_with(
            "\n(the search of one.line stopped at a line too long to search (over 16 MiB): what \
             follows it was not searched)"
        ),
        "{text}"
    );
}

/// Regression: a write's diff had no bound on its time or its recursion: 400,000 lines written
/// again shuffled overflowed a debug server's stack inside the diff, and took 21-26 s of a
/// release build's CPU. Files of many lines are diffed as a whole replacement; others get a
/// deadline.
#[test]
fn the_diff_of_a_write_of_many_lines_is_bounded() {
    let fx = Fixture::with_limits(Limits {
        write_max_bytes: 64 * 1024 * 1024,
        diff_max_bytes: 64 * 1024 * 1024,
        ..Limits::default()
    });
    let lines: Vec<String> = (0..150_000).map(|i| format!("line {i}\n")).collect();
    fx.sandbox
        .write_file(&write("many.txt", &lines.concat()))
        .unwrap();
    let reversed: String = lines.iter().rev().map(String::as_str).collect();
    let out = fx
        .sandbox
        .write_file(&write("many.txt", &reversed))
        .unwrap();
    assert!(
        out.diff
            .starts_with("--- a/many.txt\n+++ b/many.txt\n@@ -1,150000 +1,150000 @@\n-line 0\n"),
        "{}",
        &out.diff[..200]
    );
    assert!(out.diff.ends_with("+line 0\n"));
    assert_eq!(
        std::fs::read_to_string(fx.root().join("many.txt")).unwrap(),
        reversed
    );
    // What the ends share is left out of the work: one line changed in a long file is one
    // small hunk, and a long replaced middle is shown with its context.
    let mut one: Vec<String> = lines.clone();
    one[75_000] = "changed\n".into();
    fx.sandbox
        .write_file(&write("many.txt", &lines.concat()))
        .unwrap();
    let out = fx
        .sandbox
        .write_file(&write("many.txt", &one.concat()))
        .unwrap();
    assert_eq!(
        out.diff.lines().filter(|l| l.starts_with('-')).count(),
        2,
        "{}",
        out.diff
    );
    assert!(out.diff.contains("-line 75000\n+changed\n"), "{}", out.diff);
    let mut middle: Vec<String> = lines.clone();
    middle[10..140_010].reverse();
    let out = fx
        .sandbox
        .write_file(&write("many.txt", &middle.concat()))
        .unwrap();
    assert!(
        out.diff.starts_with(
            "--- a/many.txt\n+++ b/many.txt\n@@ -8,140006 +8,140006 @@\n line 7\n line 8\n line 9\n-line 10\n"
        ),
        "{}",
        &out.diff[..300]
    );
    assert!(
        out.diff
            .ends_with("+line 10\n line 140010\n line 140011\n line 140012\n")
    );
}

/// Regression: a directory on the way swapped for a link while the prompt waited took an
/// approved write elsewhere: `hooks/pre-commit` approved, `hooks` made a link to `.husky`
/// meanwhile, and the file landed in `.husky/pre-commit` while the result said
/// `hooks/pre-commit` (the file's own stamp cannot tell, for a new file).
#[test]
fn an_approved_write_is_refused_when_a_link_on_its_way_changed() {
    let fx = Fixture::new();
    fx.put("hooks/readme", "r");
    fx.put(".husky/readme", "r");
    let args = json!({"path": "hooks/pre-commit", "content": "#!/bin/sh\necho hi\n"});
    let shown = fx
        .sandbox
        .preview(ToolName::WriteFile, &args)
        .unwrap()
        .unwrap();
    assert_eq!(shown.through_link, None);
    std::fs::rename(fx.root().join("hooks"), fx.root().join("hooks.old")).unwrap();
    fx.symlink(".husky", "hooks");
    let err = runtime()
        .block_on(
            fx.sandbox
                .call_approved(ToolName::WriteFile, args.clone(), shown),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("now leads to another place"),
        "{err}"
    );
    assert!(!fx.root().join(".husky/pre-commit").exists());
    // Shown as what it is now, it is written there.
    let shown = fx
        .sandbox
        .preview(ToolName::WriteFile, &args)
        .unwrap()
        .unwrap();
    assert_eq!(shown.through_link.as_deref(), Some(".husky/pre-commit"));
    runtime()
        .block_on(fx.sandbox.call_approved(ToolName::WriteFile, args, shown))
        .unwrap();
    assert!(fx.root().join(".husky/pre-commit").exists());
}

/// Regression: `read_file` opened a special file before refusing it, so its driver's open ran
/// (a serial port raises DTR, a tape rewinds; here, a FIFO's writer waiting in `open` is woken):
/// it is looked at first now, and never opened.
#[test]
fn a_special_file_is_refused_before_it_is_opened() {
    use std::sync::mpsc;
    let fx = Fixture::new();
    let fifo = fx.root().join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (opened, was_opened) = mpsc::channel();
    let writer = {
        let fifo = fifo.clone();
        // Blocks in `open` until a reader opens the FIFO.
        std::thread::spawn(move || {
            let file = std::fs::OpenOptions::new().write(true).open(&fifo);
            let _ = opened.send(());
            drop(file);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    let err = fx.sandbox.read_file(&read("pipe")).unwrap_err();
    assert!(
        err.to_string().contains("FIFO") || err.to_string().contains("special"),
        "{err}"
    );
    assert!(
        was_opened
            .recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "the FIFO was opened"
    );
    // Let the writer go.
    use std::os::unix::fs::OpenOptionsExt;
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    writer.join().unwrap();
}

/// A write is made without a name and named only once written and synced: a crash while it
/// was written (16 MiB take a while) left a partial `.monad-*.tmp` in the folder for good. A
/// watcher listing the folder all along never sees a temporary file shorter than the content.
#[test]
fn a_write_never_shows_a_partial_temporary_file() {
    let fx = Fixture::new();
    let content = "x".repeat(16 * 1024 * 1024 - 1);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = std::thread::spawn({
        let (root, done, full) = (fx.root().to_path_buf(), done.clone(), content.len() as u64);
        move || {
            let mut partial = std::collections::BTreeSet::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for entry in std::fs::read_dir(&root).unwrap().flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with(".monad-")
                        && let Ok(meta) = entry.metadata()
                        && meta.len() < full
                    {
                        partial.insert(name);
                    }
                }
            }
            partial
        }
    });
    for _ in 0..4 {
        fx.sandbox.write_file(&write("big.txt", &content)).unwrap();
        std::fs::remove_file(fx.root().join("big.txt")).unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let partial = watcher.join().unwrap();
    assert!(
        partial.is_empty(),
        "partial temporary files seen: {partial:?}"
    );
}
