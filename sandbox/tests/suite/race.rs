//! A symbolic-link swap race: while the tools run through `root/d`, another thread swaps that
//! directory for a link to the outside directory and back, atomically (`renameat2` with
//! `RENAME_EXCHANGE`), thousands of times. A jail that checks a path and then opens it by name
//! would, now and then, open the outside; one that resolves through its handle never does.
//!
//! The outside directory holds files named like the inside ones (`f.txt`, with the text the
//! edits look for), so any read, write or edit that lands outside shows: as the secret in a
//! result, or as a change in the outside snapshot.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use monad_protocol::ErrorCode;
use monad_protocol::tools::{
    EditFileArgs, GlobArgs, ListDirArgs, ReadFileArgs, SearchArgs, StatArgs, WriteFileArgs,
};
use monad_sandbox::SandboxError;
use nix::fcntl::{RenameFlags, renameat2};

use super::support::Fixture;

/// The swapper stops by itself after this many swaps...
const MAX_SWAPS: u64 = 200_000;
/// ...or after this long, whichever comes first; or sooner, when the main loop has seen enough.
const MAX_SWAP_TIME: Duration = Duration::from_secs(5);
/// The main loop asks the swapper to stop once it has run this many rounds and seen every
/// operation both succeed inside and be refused.
const ENOUGH_ROUNDS: u64 = 150;

const INSIDE_PING: &str = "inside f: ping\n";
const INSIDE_PONG: &str = "inside f: pong\n";
const OUTSIDE_F: &str = "top secret outside f: ping\n";
const MARK: &str = "top secret";

/// How often one operation ended inside the root and how often it was refused.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    inside: u64,
    refused: u64,
}

#[derive(Default)]
struct Observed {
    tallies: Vec<(&'static str, Tally)>,
    /// Results that showed something from outside.
    leaks: Vec<String>,
    /// Errors other than the two expected outcomes.
    unexpected: Vec<String>,
}

impl Observed {
    fn tally(&mut self, op: &'static str) -> &mut Tally {
        let at = match self.tallies.iter().position(|(name, _)| *name == op) {
            Some(at) => at,
            None => {
                self.tallies.push((op, Tally::default()));
                self.tallies.len() - 1
            }
        };
        &mut self.tallies[at].1
    }

    /// Records an outcome: `Ok(true)` ended inside, a refusal (`outside_workspace`) counts as
    /// refused, `also_inside` lists error codes that also show the call looked inside
    /// (`not_found` for a name only the outside has). Anything else is unexpected.
    fn record<T: std::fmt::Debug>(
        &mut self,
        op: &'static str,
        result: &Result<T, SandboxError>,
        also_inside: &[ErrorCode],
    ) {
        match result {
            Ok(_) => self.tally(op).inside += 1,
            Err(e) if e.code() == ErrorCode::OutsideWorkspace => self.tally(op).refused += 1,
            Err(e) if also_inside.contains(&e.code()) => self.tally(op).inside += 1,
            Err(e) => {
                let note = format!("{op}: `{}`: {e}", e.code());
                if self.unexpected.len() < 20 {
                    self.unexpected.push(note);
                }
            }
        }
        if let Ok(value) = result {
            let shown = format!("{value:?}");
            if shown.contains(MARK) && self.leaks.len() < 20 {
                self.leaks.push(format!("{op}: {shown}"));
            }
        }
    }

    fn leak(&mut self, what: String) {
        if self.leaks.len() < 20 {
            self.leaks.push(what);
        }
    }

    fn saw_both_everywhere(&self) -> bool {
        self.tallies
            .iter()
            .all(|(_, t)| t.inside > 0 && t.refused > 0)
    }
}

/// Swaps `a` and `b` in the root (`renameat2` with `RENAME_EXCHANGE`, atomic) on a thread of
/// its own, at most `max` times or for [`MAX_SWAP_TIME`], until `stop`; leaves them as they
/// started. Returns how many swaps it made.
fn swap_in_a_loop(
    fx: &Fixture,
    a: &'static str,
    b: &'static str,
    max: u64,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let root = std::fs::File::open(fx.root()).unwrap();
    let stop = Arc::clone(stop);
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut swaps = 0u64;
        while swaps < max && started.elapsed() < MAX_SWAP_TIME && !stop.load(Ordering::Relaxed) {
            renameat2(&root, a, &root, b, RenameFlags::RENAME_EXCHANGE).unwrap();
            swaps += 1;
        }
        if swaps % 2 == 1 {
            renameat2(&root, a, &root, b, RenameFlags::RENAME_EXCHANGE).unwrap();
            swaps += 1;
        }
        swaps
    })
}

#[test]
fn swapping_a_directory_for_a_link_to_outside_never_leaks_or_writes_outside() {
    let fx = Fixture::new();
    fx.put("d/f.txt", INSIDE_PING);
    std::fs::write(fx.outside().join("f.txt"), OUTSIDE_F).unwrap();
    // `d` and `d_swap` trade places: one is the directory, the other the link to outside.
    fx.symlink(fx.outside(), "d_swap");
    let before = fx.outside_snapshot();

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = swap_in_a_loop(&fx, "d", "d_swap", MAX_SWAPS, &stop);

    let sandbox = Arc::clone(&fx.sandbox);
    let mut seen = Observed::default();
    let mut inside_text = INSIDE_PING;
    let mut rounds = 0u64;
    while !swapper.is_finished() {
        rounds += 1;

        let read = sandbox.read_file(&read_args("d/f.txt"));
        if let Ok(r) = &read
            && r.content != inside_text
        {
            seen.leak(format!("read d/f.txt gave {:?}", r.content));
        }
        seen.record("read_file d/f.txt", &read, &[]);

        // Only the outside has a `secret.txt`: success would be a leak, `not_found` looked inside.
        let secret = sandbox.read_file(&read_args("d/secret.txt"));
        if let Ok(r) = &secret {
            seen.leak(format!("read d/secret.txt gave {:?}", r.content));
        }
        seen.record("read_file d/secret.txt", &secret, &[ErrorCode::NotFound]);

        let write = sandbox.write_file(&WriteFileArgs {
            path: "d/new.txt".into(),
            content: format!("inside new {rounds}\n"),
            create_parents: None,
            workspace: None,
        });
        seen.record("write_file d/new.txt", &write, &[]);

        // Directories made on the way (the default): each round makes a new one under `d`,
        // which may be the link to outside at any moment.
        let made = sandbox.write_file(&WriteFileArgs {
            path: format!("d/made/r{rounds}/new.txt"),
            content: format!("inside made {rounds}\n"),
            create_parents: None,
            workspace: None,
        });
        seen.record("write_file d/made/r*/new.txt", &made, &[]);

        let (old, new) = if inside_text == INSIDE_PING {
            ("ping", "pong")
        } else {
            ("pong", "ping")
        };
        let edit = sandbox.edit_file(&EditFileArgs {
            path: "d/f.txt".into(),
            old_string: old.into(),
            new_string: new.into(),
            replace_all: None,
            workspace: None,
        });
        if edit.is_ok() {
            inside_text = if inside_text == INSIDE_PING {
                INSIDE_PONG
            } else {
                INSIDE_PING
            };
        }
        seen.record("edit_file d/f.txt", &edit, &[]);

        let list = sandbox.list_dir(&ListDirArgs {
            path: Some("d".into()),
            depth: Some(2),
            include_hidden: None,
            workspace: None,
        });
        if let Ok(l) = &list
            && let Some(stray) = l.entries.iter().find(|e| {
                e.path != "d/f.txt" && e.path != "d/new.txt" && !e.path.starts_with("d/made")
            })
        {
            seen.leak(format!("list_dir d showed {}", stray.path));
        }
        seen.record("list_dir d", &list, &[]);

        let search = sandbox.search(&SearchArgs {
            pattern: "ping|pong|secret".into(),
            path: Some("d".into()),
            glob: None,
            case_insensitive: None,
            max_results: None,
            include_hidden: None,
            context: None,
            files_only: None,
            workspace: None,
        });
        if let Ok(s) = &search
            && let Some(stray) = s.matches.iter().find(|m| m.path != "d/f.txt")
        {
            seen.leak(format!("search in d matched {stray:?}"));
        }
        seen.record("search d", &search, &[]);

        let stat = sandbox.stat(&StatArgs {
            path: "d/f.txt".into(),
            workspace: None,
        });
        if let Ok(s) = &stat
            && s.size != INSIDE_PING.len() as u64
        {
            seen.leak(format!("stat d/f.txt described another file: {s:?}"));
        }
        seen.record("stat d/f.txt", &stat, &[]);

        // Walks from the root never refuse; they must simply never show the outside.
        let glob = sandbox.glob(&GlobArgs {
            pattern: "**".into(),
            path: None,
            workspace: None,
        });
        match &glob {
            Ok(g) => {
                if let Some(stray) = g.paths.iter().find(|p| p.contains("secret")) {
                    seen.leak(format!("glob ** found {stray}"));
                }
            }
            Err(e) => seen.unexpected.push(format!("glob **: {e}")),
        }
        let whole = sandbox.search(&SearchArgs {
            pattern: MARK.into(),
            path: None,
            glob: None,
            case_insensitive: None,
            max_results: None,
            include_hidden: Some(true),
            context: None,
            files_only: None,
            workspace: None,
        });
        match &whole {
            Ok(s) if !s.matches.is_empty() => seen.leak(format!("search of the root: {s:?}")),
            Ok(_) => {}
            Err(e) => seen.unexpected.push(format!("search of the root: {e}")),
        }

        if rounds >= ENOUGH_ROUNDS && seen.saw_both_everywhere() {
            stop.store(true, Ordering::Relaxed);
        }
    }
    let swaps = swapper.join().unwrap();

    assert!(
        seen.leaks.is_empty(),
        "the outside leaked: {:#?}",
        seen.leaks
    );
    assert_eq!(
        fx.outside_snapshot(),
        before,
        "something outside was created or modified"
    );
    assert!(
        seen.unexpected.is_empty(),
        "errors other than success or refusal: {:#?}",
        seen.unexpected
    );
    assert!(
        swaps >= 1000,
        "only {swaps} swaps ran; the race was not exercised"
    );
    for (op, tally) in &seen.tallies {
        assert!(
            tally.inside > 0 && tally.refused > 0,
            "{op} never hit both outcomes in {rounds} rounds and {swaps} swaps: {tally:?}"
        );
    }
    // The inside file holds one of the two inside texts, and `d` is a directory again.
    assert_eq!(fx.read("d/f.txt"), inside_text);
    assert!(fx.root().join("d").symlink_metadata().unwrap().is_dir());
}

fn read_args(path: &str) -> ReadFileArgs {
    ReadFileArgs {
        path: path.into(),
        offset: None,
        limit: None,
        workspace: None,
    }
}

/// Regression: the check that a write is not into `.git` looked at the path, and the write then
/// opened its directory by the path again: a command swapping a directory `a` with a link to
/// `.git` (`alink`) in a loop had `write_file a/config` land in `.git/config` now and then (13
/// of 100 tries on a release build), which git runs programs from, outside any sandbox. The
/// directory opened is checked now.
#[test]
fn swapping_a_directory_for_a_link_to_git_never_writes_into_git() {
    let fx = Fixture::new();
    fx.put(".git/config", "[core]\n\tbare = false\n");
    fx.put("a/config", "innocent\n");
    fx.symlink(".git", "alink");
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = swap_in_a_loop(&fx, "a", "alink", u64::MAX, &stop);
    let (mut written, mut refused) = (0, 0);
    for round in 0..400 {
        // A path of its own each time, so that what the tools last saw of it never refuses it.
        let alias = format!("l{round}");
        fx.symlink("a", &alias);
        let write = fx.sandbox.write_file(&WriteFileArgs {
            path: format!("{alias}/config"),
            content: "[core]\n\tfsmonitor = \"touch /tmp/owned; false\"\n".into(),
            create_parents: None,
            workspace: None,
        });
        match write {
            Ok(_) => written += 1,
            Err(_) => refused += 1,
        }
        let git = std::fs::read_to_string(fx.root().join(".git/config")).unwrap();
        assert!(
            !git.contains("fsmonitor"),
            "round {round}: .git/config written"
        );
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(written > 0, "no write went through ({refused} refused)");
}

/// Regression (a review found it): a command's view of the filesystem bound the workspace's
/// `.git` by its path and then made that bind writable by its path again, so a command swapping
/// `.git` with a link to `/` in a loop (another command of the same workspace, in the
/// background) had, now and then, the next command's whole view made writable: landlock does not
/// govern a file's mode, owner or times, so that command could change those of any file its user
/// owns outside the workspace (on a laptop, the owner's own). Every path of the view is now
/// resolved without following a link and checked to be the directory the parent found.
#[test]
fn swapping_git_for_a_link_to_the_root_never_makes_the_view_writable() {
    use std::os::unix::fs::PermissionsExt;
    const TRIES: u32 = 400;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the race needs a file outside the root owned by the command's user");
        return;
    }
    let fx = Fixture::new();
    // The way to the fixture searchable by the command's user, so that the file outside the
    // root is in its view (not masked), as a laptop owner's home is.
    std::fs::set_permissions(fx.tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let theirs = fx.outside().join("theirs.txt");
    std::fs::write(&theirs, "x").unwrap();
    std::os::unix::fs::lchown(&theirs, Some(super::support::COMMAND_UID), None).unwrap();
    let mode = || std::fs::metadata(&theirs).unwrap().permissions().mode() & 0o7777;
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir(fx.root().join(".git")).unwrap();
    std::os::unix::fs::symlink("/", fx.root().join("glink")).unwrap();
    super::support::give_to_command_user(&fx.root());

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let root = std::fs::File::open(fx.root()).unwrap();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                renameat2(&root, ".git", &root, "glink", RenameFlags::RENAME_EXCHANGE).unwrap();
                swaps += 1;
            }
            if swaps % 2 == 1 {
                renameat2(&root, ".git", &root, "glink", RenameFlags::RENAME_EXCHANGE).unwrap();
            }
            swaps
        })
    };
    let target = theirs.to_str().unwrap().to_owned();
    let (mut refused, mut not_started, mut changed) = (0, 0, Vec::new());
    for i in 0..TRIES {
        let ran = super::support::try_run(&fx, &super::support::args(&["chmod", "0600", &target]));
        match &ran {
            Ok(out) if out.exit_code == Some(0) => changed.push(format!("try {i}: {out:?}")),
            Ok(_) => refused += 1,
            Err(_) => not_started += 1,
        }
        if mode() != 0o644 {
            if !matches!(&ran, Ok(out) if out.exit_code == Some(0)) {
                changed.push(format!("try {i}: the mode changed: {ran:?}"));
            }
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(
        changed.is_empty(),
        "{} of {TRIES} commands changed a file outside the root ({refused} refused, \
         {not_started} did not start, {swaps} swaps): {:?}",
        changed.len(),
        &changed[..changed.len().min(3)]
    );
    assert!(refused > 0, "no command ran ({not_started} did not start)");
}
