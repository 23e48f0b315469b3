//! The escape suite: every tool against every way out of the workspace root.
//!
//! Shaped like cap-std's `tests/cap-basics.rs`: each test walks a list of attempts. Every case
//! runs in a fresh fixture whose root is planted with traps (links to the outside by absolute
//! and relative targets, chains, loops, dangling links, `/proc` magic links, a FIFO, devices, a
//! socket; see [`plant_traps`]) and checks three things:
//!
//! 1. nothing outside the root changed (`outside_snapshot` before and after);
//! 2. the secret reached neither the result, nor the error message, nor a file inside the root;
//! 3. the outcome: a refusal with the right [`ErrorCode`] and a message that says why; for a
//!    command, a failure whose standard error says why; for a positive control (something the
//!    jail rightly allows), the allowed effect.
//!
//! Every call runs on its own thread with a deadline, so a call that hangs (a FIFO opened for
//! reading) fails its case instead of the whole run. Failures are collected and reported
//! together, each under its case's name.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use monad_protocol::ErrorCode;
use monad_protocol::tools::{
    EditFileArgs, GlobArgs, ListDirArgs, ReadFileArgs, RunCommandArgs, SearchArgs, StatArgs,
    WriteFileArgs,
};
use monad_sandbox::{Sandbox, SandboxError};
use serde::Serialize;
use serde_json::Value;

use super::support::{Fixture, SECRET, runtime};

/// What must never show up in a result, an error or a file inside the root. Both outside files
/// (`outside/secret.txt` and `root_evil/secret.txt`) hold it, and so does `outside/evil.sh`'s
/// output.
const SECRET_MARK: &str = "top secret";

/// Content of `inside.txt`, the file positive controls reach.
const INSIDE: &str = "inside text\n";

/// Content of `sub/inner.txt`.
const INNER: &str = "inner text\n";

/// What a write puts in a file.
const PWNED: &str = "pwned by the escape suite\n";

/// A call that has not answered by then is taken to hang.
const CALL_DEADLINE: Duration = Duration::from_secs(20);

/// How `why` fragments of refusals read (see `SandboxError`'s messages).
const WHY_DOTDOT: &str = "`..` would climb above the workspace root";
const WHY_ABSOLUTE: &str = "it is an absolute path outside the workspace root";
const WHY_LINK: &str = "it resolves outside the workspace root through a symbolic link";
const WHY_SPECIAL: &str = "it is a device, FIFO or socket, which the workspace never opens";
const WHY_NUL: &str = "NUL byte";
const WHY_LOOP: &str = "too many levels of symbolic links (a link loop?)";
const WHY_MISSING: &str = "does not exist";

/// What a command says when landlock (or, in namespaces, the read-only mounts around the
/// workspace) stops it.
const DENIED: &[&str] = &[
    "permission denied",
    "operation not permitted",
    "invalid cross-device link",
    "read-only file system",
];

/// Puts the traps every case runs against into a fresh fixture's root, and a program outside.
fn plant_traps(fx: &Fixture) {
    let out = fx.outside();
    fx.put("inside.txt", INSIDE);
    fx.put("sub/inner.txt", INNER);
    // Links out, to a file and to a directory, by absolute and by relative target.
    fx.symlink(out.join("secret.txt"), "abs_file_link");
    fx.symlink("../outside/secret.txt", "rel_file_link");
    fx.symlink("../../outside/secret.txt", "sub/deep_rel_link");
    fx.symlink(&out, "abs_dir_link");
    fx.symlink("../outside", "rel_dir_link");
    // To the sibling whose name has the root as a prefix.
    fx.symlink(fx.tmp.path().join("root_evil/secret.txt"), "evil_link");
    // A chain whose last link leads out: chain1 -> chain2 -> sub/chain3 -> ../abs_file_link.
    fx.symlink("chain2", "chain1");
    fx.symlink("sub/chain3", "chain2");
    fx.symlink("../abs_file_link", "sub/chain3");
    // A loop, and dangling links inside and outside.
    fx.symlink("loop_b", "loop_a");
    fx.symlink("loop_a", "loop_b");
    fx.symlink("missing.txt", "dangling_in");
    fx.symlink(out.join("ghost.txt"), "dangling_out");
    fx.symlink(out.join("ghost_dir"), "ghost_dir_link");
    // Magic links.
    fx.symlink("/proc/self/root", "proc_root_link");
    fx.symlink("/proc/self/cwd", "proc_cwd_link");
    // Links that stay inside: the jail follows these.
    fx.symlink("inside.txt", "in_file_link");
    fx.symlink("sub", "in_dir_link");
    fx.symlink("sub/../inside.txt", "in_dotdot_link");
    // Things the jail never opens.
    fx.fifo("fifo");
    fx.symlink("fifo", "fifo_link");
    fx.device("zero", false, 1, 5);
    fx.device("blockdev", true, 7, 0);
    fx.socket("sock");
    // A program outside that would print the secret if it ever ran.
    let evil = out.join("evil.sh");
    std::fs::write(&evil, format!("#!/bin/sh\necho '{}'\n", SECRET.trim())).unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// One tool call. Paths and arguments may hold `{tmp}`, `{root}` and `{outside}`.
#[derive(Clone, Debug)]
enum Call {
    Read(String),
    List {
        path: String,
        depth: u32,
    },
    Stat(String),
    Search {
        pattern: String,
        path: Option<String>,
        glob: Option<String>,
        hidden: bool,
    },
    Glob {
        pattern: String,
        path: Option<String>,
    },
    Write {
        path: String,
        create_parents: bool,
    },
    Edit {
        path: String,
        old: String,
    },
    Run {
        argv: Vec<String>,
        cwd: Option<String>,
    },
    /// Calls in order; the outcome is the last one's, or the first error.
    Seq(Vec<Call>),
}

impl Call {
    fn expanded(&self, fx: &Fixture) -> Call {
        let x = |s: &String| fx.expand(s);
        let xo = |s: &Option<String>| s.as_ref().map(|s| fx.expand(s));
        match self {
            Call::Read(p) => Call::Read(x(p)),
            Call::List { path, depth } => Call::List {
                path: x(path),
                depth: *depth,
            },
            Call::Stat(p) => Call::Stat(x(p)),
            Call::Search {
                pattern,
                path,
                glob,
                hidden,
            } => Call::Search {
                pattern: x(pattern),
                path: xo(path),
                glob: xo(glob),
                hidden: *hidden,
            },
            Call::Glob { pattern, path } => Call::Glob {
                pattern: x(pattern),
                path: xo(path),
            },
            Call::Write {
                path,
                create_parents,
            } => Call::Write {
                path: x(path),
                create_parents: *create_parents,
            },
            Call::Edit { path, old } => Call::Edit {
                path: x(path),
                old: old.clone(),
            },
            Call::Run { argv, cwd } => Call::Run {
                argv: argv.iter().map(x).collect(),
                cwd: xo(cwd),
            },
            Call::Seq(calls) => Call::Seq(calls.iter().map(|c| c.expanded(fx)).collect()),
        }
    }
}

fn read(path: &str) -> Call {
    Call::Read(path.into())
}

fn list(path: &str) -> Call {
    list_deep(path, 1)
}

fn list_deep(path: &str, depth: u32) -> Call {
    Call::List {
        path: path.into(),
        depth,
    }
}

fn stat(path: &str) -> Call {
    Call::Stat(path.into())
}

/// Searches `path` for the secret.
fn search_in(path: &str) -> Call {
    Call::Search {
        pattern: SECRET_MARK.into(),
        path: Some(path.into()),
        glob: None,
        hidden: false,
    }
}

fn search(pattern: &str, glob: Option<&str>, hidden: bool) -> Call {
    Call::Search {
        pattern: pattern.into(),
        path: None,
        glob: glob.map(Into::into),
        hidden,
    }
}

/// Globs everything under `path`.
fn glob_in(path: &str) -> Call {
    Call::Glob {
        pattern: "**".into(),
        path: Some(path.into()),
    }
}

fn glob(pattern: &str) -> Call {
    Call::Glob {
        pattern: pattern.into(),
        path: None,
    }
}

fn write(path: &str) -> Call {
    Call::Write {
        path: path.into(),
        create_parents: false,
    }
}

fn write_parents(path: &str) -> Call {
    Call::Write {
        path: path.into(),
        create_parents: true,
    }
}

/// Edits the secret (which only an escape could reach).
fn edit(path: &str) -> Call {
    Call::Edit {
        path: path.into(),
        old: SECRET_MARK.into(),
    }
}

/// Edits `inside.txt`'s text (for positive controls).
fn edit_inside(path: &str) -> Call {
    Call::Edit {
        path: path.into(),
        old: "inside".into(),
    }
}

fn run(argv: &[&str]) -> Call {
    Call::Run {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
    }
}

fn sh(script: &str) -> Call {
    run(&["sh", "-c", script])
}

fn run_in(cwd: &str, argv: &[&str]) -> Call {
    Call::Run {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: Some(cwd.into()),
    }
}

/// What a case must end in.
enum Expect {
    /// Refused with this code and a message containing this fragment.
    Refused(ErrorCode, &'static str),
    /// Allowed; the check looks at the result and the workspace.
    Allowed(fn(&Fixture, &Value) -> Result<(), String>),
    /// A command that runs and fails; its standard error contains one of these (any case).
    CommandFails(&'static [&'static str]),
}

struct Case {
    name: &'static str,
    call: Call,
    expect: Expect,
    /// Extra setup after the traps, before the snapshot.
    setup: Option<fn(&Fixture)>,
}

fn refused(name: &'static str, call: Call, code: ErrorCode, why: &'static str) -> Case {
    Case {
        name,
        call,
        expect: Expect::Refused(code, why),
        setup: None,
    }
}

fn escape(name: &'static str, call: Call, why: &'static str) -> Case {
    refused(name, call, ErrorCode::OutsideWorkspace, why)
}

fn allowed(
    name: &'static str,
    call: Call,
    check: fn(&Fixture, &Value) -> Result<(), String>,
) -> Case {
    Case {
        name,
        call,
        expect: Expect::Allowed(check),
        setup: None,
    }
}

fn command_fails(name: &'static str, call: Call, why: &'static [&'static str]) -> Case {
    Case {
        name,
        call,
        expect: Expect::CommandFails(why),
        setup: None,
    }
}

impl Case {
    fn with_setup(mut self, setup: fn(&Fixture)) -> Case {
        self.setup = Some(setup);
        self
    }
}

/// Runs every case and fails once, naming each case that went wrong and how.
fn run_cases(group: &str, cases: Vec<Case>) {
    run_cases_with(group, cases, &monad_sandbox::ExecPolicy::default());
}

/// [`run_cases`] with commands under `exec`.
fn run_cases_with(group: &str, cases: Vec<Case>, exec: &monad_sandbox::ExecPolicy) {
    let mut names = std::collections::HashSet::new();
    for case in &cases {
        assert!(names.insert(case.name), "duplicate case name {}", case.name);
    }
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            run_case(case, exec)
                .err()
                .map(|e| format!("- {}: {e}", case.name))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} {group} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn run_case(case: &Case, exec: &monad_sandbox::ExecPolicy) -> Result<(), String> {
    let fx = Fixture::with(monad_sandbox::Limits::default(), exec.clone());
    plant_traps(&fx);
    if let Some(setup) = case.setup {
        setup(&fx);
    }
    let before = fx.outside_snapshot();
    let root_before = fx.root_snapshot();
    let call = case.call.expanded(&fx);
    let (outcome, shown) = call_with_deadline(&fx.sandbox, call)?;
    let mut problems = Vec::new();
    let after = fx.outside_snapshot();
    if before != after {
        problems.push(format!(
            "the outside changed: {}",
            describe_change(&before, &after)
        ));
    }
    // A refusal touches nothing (a sequence's first steps are meant to change the root).
    let refusal = matches!(case.expect, Expect::Refused(..)) && !matches!(case.call, Call::Seq(_));
    if refusal && fx.root_snapshot() != root_before {
        problems.push(format!(
            "a refused call changed the root: {}",
            describe_change(&root_before, &fx.root_snapshot())
        ));
    }
    if shown.contains(SECRET_MARK) {
        problems.push(format!("the secret leaked into the result: {shown}"));
    }
    let leaked = fx.root_files_containing(SECRET_MARK);
    if !leaked.is_empty() {
        problems.push(format!("the secret leaked into the root: {leaked:?}"));
    }
    if let Err(e) = check_outcome(&fx, &case.expect, &outcome) {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

type Snapshot = Vec<(std::path::PathBuf, Vec<u8>)>;

fn describe_change(before: &Snapshot, after: &Snapshot) -> String {
    let gone: Vec<_> = before
        .iter()
        .filter(|e| !after.contains(e))
        .map(|e| &e.0)
        .collect();
    let new: Vec<_> = after
        .iter()
        .filter(|e| !before.contains(e))
        .map(|e| &e.0)
        .collect();
    format!("changed or removed {gone:?}, changed or created {new:?}")
}

type Outcome = Result<Value, SandboxError>;

/// Runs `call` on its own thread; returns its outcome and everything it showed (results and
/// error messages of every step), or an error when it hangs or panics.
fn call_with_deadline(sandbox: &Arc<Sandbox>, call: Call) -> Result<(Outcome, String), String> {
    let (tx, rx) = mpsc::channel();
    let sandbox = Arc::clone(sandbox);
    std::thread::spawn(move || {
        let mut shown = String::new();
        let outcome = perform(&sandbox, &call, &mut shown);
        let _ = tx.send((outcome, shown));
    });
    rx.recv_timeout(CALL_DEADLINE).map_err(|e| match e {
        mpsc::RecvTimeoutError::Timeout => {
            format!("no answer in {CALL_DEADLINE:?}: the call hangs")
        }
        mpsc::RecvTimeoutError::Disconnected => "the call panicked".to_owned(),
    })
}

fn perform(sandbox: &Sandbox, call: &Call, shown: &mut String) -> Outcome {
    fn json<T: Serialize>(result: Result<T, SandboxError>) -> Outcome {
        result.map(|r| serde_json::to_value(r).unwrap())
    }
    let outcome = match call {
        Call::Read(path) => json(sandbox.read_file(&ReadFileArgs {
            path: path.clone(),
            offset: None,
            limit: None,
            workspace: None,
        })),
        Call::List { path, depth } => json(sandbox.list_dir(&ListDirArgs {
            path: Some(path.clone()),
            depth: Some(*depth),
            include_hidden: Some(true),
            workspace: None,
        })),
        Call::Stat(path) => json(sandbox.stat(&StatArgs {
            path: path.clone(),
            workspace: None,
        })),
        Call::Search {
            pattern,
            path,
            glob,
            hidden,
        } => json(sandbox.search(&SearchArgs {
            pattern: pattern.clone(),
            path: path.clone(),
            glob: glob.clone(),
            case_insensitive: Some(true),
            max_results: None,
            include_hidden: Some(*hidden),
            context: None,
            files_only: None,
            workspace: None,
        })),
        Call::Glob { pattern, path } => json(sandbox.glob(&GlobArgs {
            pattern: pattern.clone(),
            path: path.clone(),
            workspace: None,
        })),
        Call::Write {
            path,
            create_parents,
        } => json(sandbox.write_file(&WriteFileArgs {
            path: path.clone(),
            content: PWNED.into(),
            create_parents: Some(*create_parents),
            workspace: None,
        })),
        Call::Edit { path, old } => json(sandbox.edit_file(&EditFileArgs {
            path: path.clone(),
            old_string: old.clone(),
            new_string: "pwned".into(),
            replace_all: Some(true),
            workspace: None,
        })),
        Call::Run { argv, cwd } => json(runtime().block_on(sandbox.run_command(&RunCommandArgs {
            argv: argv.clone(),
            cwd: cwd.clone(),
            timeout_ms: Some(10_000),
            stdin: None,
            background: None,
            background_after_ms: None,
            workspace: None,
        }))),
        Call::Seq(calls) => {
            let mut last = Ok(Value::Null);
            for call in calls {
                last = perform(sandbox, call, shown);
                if last.is_err() {
                    break;
                }
            }
            return last;
        }
    };
    match &outcome {
        Ok(value) => shown.push_str(&value.to_string()),
        Err(err) => shown.push_str(&err.to_string()),
    }
    shown.push('\n');
    outcome
}

fn check_outcome(fx: &Fixture, expect: &Expect, outcome: &Outcome) -> Result<(), String> {
    match (expect, outcome) {
        (Expect::Refused(code, why), Err(err)) => {
            let message = err.to_string();
            if err.code() != *code || !message.contains(why) {
                return Err(format!(
                    "expected `{code}` saying {why:?}, got `{}`: {message}",
                    err.code()
                ));
            }
            Ok(())
        }
        (Expect::Refused(code, _), Ok(value)) => Err(format!(
            "expected a `{code}` refusal, but it succeeded: {value}"
        )),
        (Expect::Allowed(check), Ok(value)) => check(fx, value),
        (Expect::Allowed(_), Err(err)) => {
            Err(format!("expected success, got `{}`: {err}", err.code()))
        }
        (Expect::CommandFails(whys), Ok(value)) => {
            let stderr = value["stderr"].as_str().unwrap_or("").to_lowercase();
            let stdout = value["stdout"].as_str().unwrap_or("");
            if value["exit_code"] == 0 {
                return Err(format!("the command succeeded: {value}"));
            }
            if value["sandbox"] != "landlock" {
                return Err(format!("the command ran without landlock: {value}"));
            }
            if !whys.iter().any(|why| stderr.contains(why)) {
                return Err(format!("stderr does not say one of {whys:?}: {value}"));
            }
            if stdout.contains("secret") {
                return Err(format!("stdout names the secret: {value}"));
            }
            Ok(())
        }
        (Expect::CommandFails(_), Err(err)) => Err(format!(
            "expected the command to run and fail, got `{}`: {err}",
            err.code()
        )),
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// A read result's content is `want`.
fn content_is(value: &Value, want: &str) -> Result<(), String> {
    ensure(value["content"] == want, || {
        format!("expected content {want:?}, got {value}")
    })
}

/// The paths of a listing, glob or search result.
fn paths(value: &Value) -> Vec<String> {
    let items = value
        .get("entries")
        .or_else(|| value.get("paths"))
        .or_else(|| value.get("matches"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    items
        .iter()
        .map(|item| {
            item.as_str()
                .or_else(|| item["path"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Nothing in the result lies below one of the links planted by [`plant_traps`].
fn nothing_below_links(value: &Value) -> Result<(), String> {
    const LINKS: &[&str] = &[
        "abs_dir_link/",
        "rel_dir_link/",
        "in_dir_link/",
        "proc_root_link/",
        "proc_cwd_link/",
        "ghost_dir_link/",
        "sub/deep_rel_link/",
        "abs_file_link/",
    ];
    let below: Vec<String> = paths(value)
        .into_iter()
        .filter(|p| LINKS.iter().any(|l| p.starts_with(l)))
        .collect();
    ensure(below.is_empty(), || {
        format!("the walk went through links: {below:?}")
    })
}

fn root_file_is(fx: &Fixture, rel: &str, want: &str) -> Result<(), String> {
    let path = fx.root().join(rel);
    let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("{rel}: {e}"))?;
    ensure(meta.is_file(), || format!("{rel} is not a regular file"))?;
    let got = fx.read(rel);
    ensure(got == want, || {
        format!("{rel} holds {got:?}, expected {want:?}")
    })
}

fn is_link(fx: &Fixture, rel: &str) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(fx.root().join(rel)).map_err(|e| format!("{rel}: {e}"))?;
    ensure(meta.file_type().is_symlink(), || {
        format!("{rel} is no longer a symbolic link")
    })
}

#[test]
fn parent_traversal_is_refused_by_every_tool() {
    let e = |name, call| escape(name, call, WHY_DOTDOT);
    run_cases(
        "parent traversal",
        vec![
            e("read leading ..", read("../outside/secret.txt")),
            e("read middle ..", read("sub/../../outside/secret.txt")),
            e(
                "read repeated ..",
                read("../../../../../../../../../etc/passwd"),
            ),
            e("read ./..", read("./../outside/secret.txt")),
            e(
                "read .. after an absolute path inside the root",
                read("{root}/../outside/secret.txt"),
            ),
            e(
                "read .. climbing into the sibling-prefix dir",
                read("sub/../../root_evil/secret.txt"),
            ),
            e("list ..", list("..")),
            e("list trailing ..", list("sub/../..")),
            e("list absolute root then ..", list("{root}/..")),
            e("stat leading ..", stat("../outside/secret.txt")),
            e("stat trailing ..", stat("sub/inner.txt/../../..")),
            e("search in ..", search_in("..")),
            e("search in ../outside", search_in("../outside")),
            e("glob in ..", glob_in("..")),
            e(
                "glob in absolute root then ..",
                glob_in("{root}/../outside"),
            ),
            e("write leading ..", write("../outside/new.txt")),
            e(
                "write over outside file by middle ..",
                write("sub/../../outside/secret.txt"),
            ),
            e(
                "write with create_parents and ..",
                write_parents("../outside/made/new.txt"),
            ),
            e("edit leading ..", edit("../outside/secret.txt")),
            e(
                "edit absolute root then ..",
                edit("{root}/sub/../../outside/secret.txt"),
            ),
            e(
                "run with cwd ..",
                run_in("..", &["cat", "outside/secret.txt"]),
            ),
            e("run with cwd trailing ..", run_in("sub/../..", &["ls"])),
            allowed(
                "read a/../b inside the root",
                read("sub/../inside.txt"),
                |_, v| content_is(v, INSIDE),
            ),
            allowed(
                "write a/../b inside the root",
                write("sub/../new.txt"),
                |fx, _| root_file_is(fx, "new.txt", PWNED),
            ),
            allowed("list a/.. is the root", list("sub/.."), |_, v| {
                ensure(paths(v).contains(&"inside.txt".to_owned()), || {
                    format!("the root listing lacks inside.txt: {v}")
                })
            }),
            allowed(
                "link/.. folds lexically and stays inside",
                read("abs_dir_link/../inside.txt"),
                |_, v| content_is(v, INSIDE),
            ),
        ],
    );
}

#[test]
fn absolute_paths_outside_the_root_are_refused_by_every_tool() {
    let e = |name, call| escape(name, call, WHY_ABSOLUTE);
    run_cases(
        "absolute path",
        vec![
            e(
                "read an absolute outside file",
                read("{outside}/secret.txt"),
            ),
            e("read /etc/passwd", read("/etc/passwd")),
            e(
                "read the sibling-prefix dir",
                read("{tmp}/root_evil/secret.txt"),
            ),
            e("read //-prefixed path", read("//etc/passwd")),
            e("list /", list("/")),
            e("list the outside dir", list("{outside}")),
            e("list the sibling-prefix dir", list("{tmp}/root_evil")),
            e(
                "stat an absolute outside file",
                stat("{outside}/secret.txt"),
            ),
            e(
                "stat the sibling-prefix file",
                stat("{tmp}/root_evil/secret.txt"),
            ),
            e("search in the outside dir", search_in("{outside}")),
            e(
                "search the sibling-prefix file",
                search_in("{tmp}/root_evil/secret.txt"),
            ),
            e("glob in the outside dir", glob_in("{outside}")),
            e("write an absolute outside path", write("{outside}/new.txt")),
            e(
                "write the sibling-prefix file",
                write("{tmp}/root_evil/secret.txt"),
            ),
            e(
                "write outside with create_parents",
                write_parents("{outside}/made/new.txt"),
            ),
            e(
                "edit an absolute outside file",
                edit("{outside}/secret.txt"),
            ),
            e(
                "edit the sibling-prefix file",
                edit("{tmp}/root_evil/secret.txt"),
            ),
            e(
                "run with cwd outside",
                run_in("{outside}", &["cat", "secret.txt"]),
            ),
            e("run with cwd /", run_in("/", &["ls"])),
            allowed(
                "read an absolute path inside the root",
                read("{root}/inside.txt"),
                |_, v| content_is(v, INSIDE),
            ),
            allowed(
                "write an absolute path inside the root",
                write("{root}/sub/new.txt"),
                |fx, _| root_file_is(fx, "sub/new.txt", PWNED),
            ),
            allowed(
                "list the root by its absolute path",
                list("{root}/"),
                |_, v| ensure(v["path"] == ".", || format!("expected the root: {v}")),
            ),
            refused(
                "glob with an absolute outside pattern is refused",
                glob("{outside}/*"),
                ErrorCode::InvalidArguments,
                "starts outside the workspace root",
            ),
            allowed(
                "glob with a ../ pattern finds nothing",
                glob("../outside/*"),
                |_, v| ensure(paths(v).is_empty(), || format!("matched: {v}")),
            ),
            allowed(
                "search filtered by a ../ glob finds nothing",
                search(".", Some("../outside/*"), true),
                |_, v| ensure(paths(v).is_empty(), || format!("matched: {v}")),
            ),
        ],
    );
}

#[test]
fn links_leading_outside_are_refused_by_the_read_tools() {
    let e = |name, call| escape(name, call, WHY_LINK);
    let loop_ = |name, call| refused(name, call, ErrorCode::WrongFileType, WHY_LOOP);
    run_cases(
        "read through links",
        vec![
            e(
                "read final link with absolute target",
                read("abs_file_link"),
            ),
            e(
                "read final link with relative target",
                read("rel_file_link"),
            ),
            e(
                "read nested link with ../../ target",
                read("sub/deep_rel_link"),
            ),
            e("read chained links", read("chain1")),
            e("read link to the sibling-prefix dir", read("evil_link")),
            e(
                "read middle link to outside dir (absolute)",
                read("abs_dir_link/secret.txt"),
            ),
            e(
                "read middle link to outside dir (relative)",
                read("rel_dir_link/secret.txt"),
            ),
            e("read dangling link to outside", read("dangling_out")),
            loop_("read looping links", read("loop_a")),
            refused(
                "read dangling link inside",
                read("dangling_in"),
                ErrorCode::NotFound,
                WHY_MISSING,
            ),
            e("list link to outside dir (absolute)", list("abs_dir_link")),
            e("list link to outside dir (relative)", list("rel_dir_link/")),
            e("list dangling link to outside dir", list("ghost_dir_link")),
            loop_("list looping links", list("loop_b")),
            e(
                "stat through middle link (absolute)",
                stat("abs_dir_link/secret.txt"),
            ),
            e(
                "stat through middle link (relative)",
                stat("rel_dir_link/secret.txt"),
            ),
            e(
                "search a final link to outside file",
                search_in("abs_file_link"),
            ),
            e("search a link to outside dir", search_in("rel_dir_link")),
            e("search chained links", search_in("chain1")),
            e(
                "glob in a link to outside dir (absolute)",
                glob_in("abs_dir_link"),
            ),
            e(
                "glob in a link to outside dir (relative)",
                glob_in("rel_dir_link"),
            ),
            e(
                "run with cwd a link to outside dir",
                run_in("abs_dir_link", &["cat", "secret.txt"]),
            ),
            e(
                "run with cwd a relative link to outside dir",
                run_in("rel_dir_link", &["ls"]),
            ),
            e(
                "run with cwd a dangling link to outside",
                run_in("ghost_dir_link", &["ls"]),
            ),
            allowed("read link to inside file", read("in_file_link"), |_, v| {
                content_is(v, INSIDE)
            }),
            allowed(
                "read link whose target has .. inside",
                read("in_dotdot_link"),
                |_, v| content_is(v, INSIDE),
            ),
            allowed("list link to inside dir", list("in_dir_link"), |_, v| {
                ensure(
                    paths(v).contains(&"in_dir_link/inner.txt".to_owned()),
                    || format!("listing: {v}"),
                )
            }),
            allowed(
                "stat describes an outside link without following it",
                stat("abs_file_link"),
                |fx, v| {
                    let target = fx.outside().join("secret.txt");
                    ensure(
                        v["kind"] == "symlink"
                            && v["link_target"] == target.to_str().unwrap()
                            && v["size"] != SECRET.len(),
                        || format!("stat followed or misdescribed the link: {v}"),
                    )
                },
            ),
            allowed(
                "stat with a trailing slash still describes the link",
                stat("abs_dir_link/"),
                |_, v| {
                    ensure(v["kind"] == "symlink", || {
                        format!("stat followed the link: {v}")
                    })
                },
            ),
            allowed(
                "search through a link to inside dir",
                search("inner", None, false),
                |_, v| ensure(paths(v) == ["sub/inner.txt"], || format!("matches: {v}")),
            ),
            allowed(
                "run with cwd a link to inside dir",
                run_in("in_dir_link", &["cat", "inner.txt"]),
                |_, v| {
                    ensure(v["exit_code"] == 0 && v["stdout"] == INNER, || {
                        format!("{v}")
                    })
                },
            ),
        ],
    );
}

#[test]
fn writes_and_edits_never_follow_links_out() {
    let e = |name, call| escape(name, call, WHY_LINK);
    run_cases(
        "write through links",
        vec![
            e(
                "write final link to outside file (absolute)",
                write("abs_file_link"),
            ),
            e(
                "write final link to outside file (relative)",
                write("rel_file_link"),
            ),
            e(
                "write nested link with ../../ target",
                write("sub/deep_rel_link"),
            ),
            e("write chained links", write("chain1")),
            e("write link to the sibling-prefix dir", write("evil_link")),
            e("write dangling link to outside", write("dangling_out")),
            e(
                "write through middle link (absolute)",
                write("abs_dir_link/new.txt"),
            ),
            e(
                "write through middle link (relative)",
                write("rel_dir_link/new.txt"),
            ),
            e(
                "overwrite through middle link",
                write("abs_dir_link/secret.txt"),
            ),
            e(
                "create_parents through link to outside dir",
                write_parents("abs_dir_link/made/new.txt"),
            ),
            e(
                "create_parents through relative link to outside dir",
                write_parents("rel_dir_link/a/b/new.txt"),
            ),
            e(
                "create_parents through dangling link to outside dir",
                write_parents("ghost_dir_link/new.txt"),
            ),
            refused(
                "write looping links",
                write("loop_a"),
                ErrorCode::WrongFileType,
                WHY_LOOP,
            ),
            refused(
                "write dangling link inside",
                write("dangling_in"),
                ErrorCode::WrongFileType,
                "is a symbolic link whose target does not exist",
            ),
            e(
                "edit final link to outside file (absolute)",
                edit("abs_file_link"),
            ),
            e(
                "edit final link to outside file (relative)",
                edit("rel_file_link"),
            ),
            e("edit chained links", edit("chain1")),
            e("edit link to the sibling-prefix dir", edit("evil_link")),
            e(
                "edit through middle link (absolute)",
                edit("abs_dir_link/secret.txt"),
            ),
            e(
                "edit through middle link (relative)",
                edit("rel_dir_link/secret.txt"),
            ),
            allowed(
                "write through link to inside file",
                write("in_file_link"),
                |fx, _| {
                    root_file_is(fx, "inside.txt", PWNED)?;
                    is_link(fx, "in_file_link")
                },
            ),
            allowed(
                "edit through link to inside file",
                edit_inside("in_file_link"),
                |fx, _| {
                    root_file_is(fx, "inside.txt", "pwned text\n")?;
                    is_link(fx, "in_file_link")
                },
            ),
            allowed(
                "write through link to inside dir",
                write("in_dir_link/new.txt"),
                |fx, _| root_file_is(fx, "sub/new.txt", PWNED),
            ),
            allowed(
                "create_parents through link to inside dir",
                write_parents("in_dir_link/deeper/new.txt"),
                |fx, _| root_file_is(fx, "sub/deeper/new.txt", PWNED),
            ),
        ],
    );
}

#[test]
fn special_files_are_refused_without_hanging() {
    // Inside the workspace, so not `outside_workspace`: of a kind it never opens.
    let e = |name, call| refused(name, call, ErrorCode::WrongFileType, WHY_SPECIAL);
    run_cases(
        "special file",
        vec![
            e("read a FIFO", read("fifo")),
            e("read a link to a FIFO", read("fifo_link")),
            e("read a character device", read("zero")),
            e("read a block device", read("blockdev")),
            e("read a socket", read("sock")),
            e("write a FIFO", write("fifo")),
            e("write a character device", write("zero")),
            e("edit a FIFO", edit("fifo")),
            e("edit a socket", edit("sock")),
            e("search a FIFO", search_in("fifo")),
            e("search a device", search_in("zero")),
            e("glob in a FIFO", glob_in("fifo")),
            allowed(
                "stat describes a FIFO without opening it",
                stat("fifo"),
                |_, v| ensure(v["kind"] == "other", || format!("{v}")),
            ),
            allowed("list shows special files as other", list(""), |_, v| {
                let others: Vec<&str> = v["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["kind"] == "other")
                    .map(|e| e["path"].as_str().unwrap())
                    .collect();
                ensure(others == ["blockdev", "fifo", "sock", "zero"], || {
                    format!("{v}")
                })
            }),
            allowed(
                "search skips special files",
                search("text", None, false),
                |_, v| {
                    ensure(paths(v) == ["inside.txt", "sub/inner.txt"], || {
                        format!("{v}")
                    })
                },
            ),
            allowed("glob skips special files", glob("*"), |_, v| {
                ensure(paths(v) == ["inside.txt"], || format!("{v}"))
            }),
        ],
    );
}

#[test]
fn proc_magic_links_are_refused() {
    let abs = |name, call| escape(name, call, WHY_ABSOLUTE);
    let link = |name, call| escape(name, call, WHY_LINK);
    run_cases(
        "/proc magic link",
        vec![
            abs(
                "read /proc/self/root/...",
                read("/proc/self/root{outside}/secret.txt"),
            ),
            abs("read /proc/self/cwd/...", read("/proc/self/cwd/Cargo.toml")),
            abs(
                "read /proc/self/root into the root",
                read("/proc/self/root{root}/inside.txt"),
            ),
            abs("read /proc/self/fd/0", read("/proc/self/fd/0")),
            abs("list /proc/self/root", list("/proc/self/root")),
            abs(
                "stat /proc/self/root/...",
                stat("/proc/self/root{outside}/secret.txt"),
            ),
            abs("search /proc/self/cwd", search_in("/proc/self/cwd")),
            abs(
                "write /proc/self/root/...",
                write("/proc/self/root{outside}/new.txt"),
            ),
            abs(
                "edit /proc/self/root/...",
                edit("/proc/self/root{outside}/secret.txt"),
            ),
            abs(
                "run with cwd /proc/self/root/...",
                run_in("/proc/self/root{outside}", &["ls"]),
            ),
            link(
                "read through link to /proc/self/root",
                read("proc_root_link{outside}/secret.txt"),
            ),
            link(
                "read through link to /proc/self/cwd",
                read("proc_cwd_link/Cargo.toml"),
            ),
            link("list link to /proc/self/root", list("proc_root_link")),
            link(
                "stat through link to /proc/self/root",
                stat("proc_root_link{outside}/secret.txt"),
            ),
            link(
                "search through link to /proc/self/root",
                search_in("proc_root_link{outside}"),
            ),
            link(
                "glob through link to /proc/self/root",
                glob_in("proc_root_link"),
            ),
            link(
                "write through link to /proc/self/root",
                write("proc_root_link{outside}/new.txt"),
            ),
            link(
                "edit through link to /proc/self/root",
                edit("proc_root_link{outside}/secret.txt"),
            ),
            link(
                "run with cwd link to /proc/self/root",
                run_in("proc_root_link", &["ls"]),
            ),
            allowed(
                "stat describes a link to /proc/self/root",
                stat("proc_root_link"),
                |_, v| {
                    ensure(
                        v["kind"] == "symlink" && v["link_target"] == "/proc/self/root",
                        || format!("{v}"),
                    )
                },
            ),
        ],
    );
}

#[test]
fn encoded_and_escaped_dots_are_taken_literally() {
    let missing = |name, call| refused(name, call, ErrorCode::NotFound, WHY_MISSING);
    run_cases(
        "literal name",
        vec![
            missing("read %2e%2e/ is a name", read("%2e%2e/outside/secret.txt")),
            missing(
                "read %2e%2e%2f is a name",
                read("%2e%2e%2foutside%2fsecret.txt"),
            ),
            missing(
                "read backslashes are a name",
                read("..\\outside\\secret.txt"),
            ),
            missing("read ~ is not expanded", read("~/secret.txt")),
            missing("read ... is a name", read(".../outside/secret.txt")),
            missing("list %2e%2e is a name", list("%2e%2e")),
            missing("stat backslashes are a name", stat("..\\outside")),
            missing("edit %2e%2e/ is a name", edit("%2e%2e/outside/secret.txt")),
            allowed(
                "write %2e%2e/ creates a directory of that name inside",
                write_parents("%2e%2e/outside/new.txt"),
                |fx, _| root_file_is(fx, "%2e%2e/outside/new.txt", PWNED),
            ),
            allowed(
                "write backslashes create a file of that name inside",
                write("..\\new.txt"),
                |fx, _| root_file_is(fx, "..\\new.txt", PWNED),
            ),
            allowed(
                "write ~/ creates a directory named ~ inside",
                write_parents("~/new.txt"),
                |fx, _| root_file_is(fx, "~/new.txt", PWNED),
            ),
            command_fails(
                "a command is given %2e%2e literally",
                run(&["cat", "%2e%2e/outside/secret.txt"]),
                &["no such file or directory"],
            ),
        ],
    );
}

#[test]
fn nul_bytes_are_refused_by_every_tool() {
    let e = |name, call| refused(name, call, ErrorCode::InvalidArguments, WHY_NUL);
    run_cases(
        "NUL byte",
        vec![
            e(
                "read NUL then ..",
                read("inside.txt\0../../outside/secret.txt"),
            ),
            e("read a lone NUL", read("\0")),
            e("list NUL", list("sub\0")),
            e("stat NUL", stat("inside.txt\0")),
            e("search NUL", search_in("sub\0/..")),
            e("glob NUL", glob_in("\0")),
            e("write NUL", write("new\0.txt")),
            e("edit NUL", edit("inside.txt\0")),
            e(
                "run argv with NUL",
                run(&["cat", "inside.txt\0{outside}/secret.txt"]),
            ),
            e("run cwd with NUL", run_in("sub\0", &["ls"])),
        ],
    );
}

#[test]
fn commands_cannot_read_or_modify_outside() {
    run_cases("command", command_cases());
}

/// The same attacks where commands have no namespaces (the fallback): landlock and seccomp
/// alone stop them.
#[test]
fn commands_cannot_read_or_modify_outside_without_namespaces() {
    let exec = monad_sandbox::ExecPolicy {
        namespaces: monad_sandbox::NamespacePolicy::Off,
        ..Default::default()
    };
    run_cases_with("command (no namespaces)", command_cases(), &exec);
}

fn command_cases() -> Vec<Case> {
    let d = |name, call| command_fails(name, call, DENIED);
    {
        vec![
            d("cat an outside file", run(&["cat", "{outside}/secret.txt"])),
            d(
                "cat the sibling-prefix file",
                run(&["cat", "{tmp}/root_evil/secret.txt"]),
            ),
            d(
                "cat root/../outside",
                run(&["cat", "{root}/../outside/secret.txt"]),
            ),
            d(
                "cat through /proc/self/root",
                run(&["cat", "/proc/self/root{outside}/secret.txt"]),
            ),
            d(
                "cat through an in-root link",
                run(&["cat", "abs_file_link"]),
            ),
            d(
                "cat through an in-root dir link",
                run(&["cat", "abs_dir_link/secret.txt"]),
            ),
            d("cd .. then cat", sh("cd .. && cat outside/secret.txt")),
            // Denied without namespaces (landlock); in them, pid 1 (init, a copy of Monad) is
            // not even shown.
            command_fails(
                "cat /proc/1/environ",
                run(&["cat", "/proc/1/environ"]),
                &[
                    "permission denied",
                    "operation not permitted",
                    "no such file",
                ],
            ),
            d("ls /root", run(&["ls", "/root"])),
            d("ls the outside dir", run(&["ls", "{outside}"])),
            d(
                "redirect into a new outside file",
                sh("echo pwned > {outside}/new.txt"),
            ),
            d(
                "append to an outside file",
                sh("echo pwned >> {outside}/secret.txt"),
            ),
            d(
                "redirect through an in-root link",
                sh("echo pwned > abs_file_link"),
            ),
            d(
                "touch an outside file",
                run(&["touch", "{outside}/new.txt"]),
            ),
            d("mkdir outside", run(&["mkdir", "{outside}/made"])),
            d("rm an outside file", run(&["rm", "{outside}/secret.txt"])),
            d(
                "truncate an outside file",
                run(&["truncate", "-s", "0", "{outside}/secret.txt"]),
            ),
            d(
                "cp an outside file in",
                run(&["cp", "{outside}/secret.txt", "copy.txt"]),
            ),
            d(
                "cp -rL through a dir link",
                run(&["cp", "-rL", "abs_dir_link", "copied"]),
            ),
            d(
                "hard-link an outside file in",
                run(&["ln", "{outside}/secret.txt", "hard.txt"]),
            ),
            d(
                "ln -s then cat",
                sh("ln -s {outside}/secret.txt soft && cat soft"),
            ),
            d(
                "mv an outside file in",
                run(&["mv", "{outside}/secret.txt", "stolen.txt"]),
            ),
            d(
                "mv an in-root file out",
                run(&["mv", "inside.txt", "{outside}/inside.txt"]),
            ),
            command_fails(
                "bind-mount the outside in",
                run(&["mount", "--bind", "{outside}", "sub"]),
                &[
                    "permission denied",
                    "operation not permitted",
                    "must be superuser",
                ],
            ),
            command_fails(
                "sh runs an outside script",
                run(&["sh", "{outside}/evil.sh"]),
                &["permission denied", "can't open"],
            ),
            refused(
                "exec an outside program",
                run(&["{outside}/evil.sh"]),
                ErrorCode::InvalidArguments,
                "cannot be executed here",
            ),
            escape(
                "read a link a command planted",
                Call::Seq(vec![
                    run(&["ln", "-s", "{outside}/secret.txt", "planted"]),
                    read("planted"),
                ]),
                WHY_LINK,
            ),
            escape(
                "write through a dir link a command planted",
                Call::Seq(vec![
                    run(&["ln", "-s", "{outside}", "planted_dir"]),
                    write("planted_dir/new.txt"),
                ]),
                WHY_LINK,
            ),
            refused(
                "read a FIFO a command planted",
                Call::Seq(vec![run(&["mkfifo", "planted_fifo"]), read("planted_fifo")]),
                ErrorCode::WrongFileType,
                WHY_SPECIAL,
            ),
            allowed(
                "a command writes and reads inside the root",
                sh("echo made > made.txt && cat made.txt inside.txt"),
                |fx, v| {
                    ensure(
                        v["exit_code"] == 0 && v["stdout"] == format!("made\n{INSIDE}"),
                        || format!("{v}"),
                    )?;
                    root_file_is(fx, "made.txt", "made\n")
                },
            ),
        ]
    }
}

#[test]
fn search_and_glob_never_descend_into_links_leading_outside() {
    run_cases(
        "walk",
        vec![
            allowed(
                "search for the secret finds nothing",
                search(SECRET_MARK, None, false),
                |_, v| {
                    ensure(paths(v).is_empty() && v["files_searched"] != 0, || {
                        format!("{v}")
                    })
                },
            ),
            allowed(
                "search hidden files for the secret finds nothing",
                search(SECRET_MARK, None, true),
                |_, v| {
                    ensure(paths(v).is_empty() && v["files_searched"] != 0, || {
                        format!("{v}")
                    })
                },
            ),
            allowed(
                "search with a glob naming a link finds nothing",
                search(".", Some("abs_dir_link/*"), true),
                |_, v| ensure(paths(v).is_empty(), || format!("{v}")),
            ),
            allowed(
                "search finds an inside file once",
                search("inner", None, true),
                |_, v| ensure(paths(v) == ["sub/inner.txt"], || format!("{v}")),
            ),
            allowed("glob ** goes through no link", glob("**"), |_, v| {
                nothing_below_links(v)?;
                ensure(paths(v).contains(&"sub/inner.txt".to_owned()), || {
                    format!("{v}")
                })
            }),
            allowed(
                "glob **/secret.txt finds nothing",
                glob("**/secret.txt"),
                |_, v| ensure(paths(v).is_empty(), || format!("{v}")),
            ),
            allowed(
                "glob */secret.txt finds nothing",
                glob("*/secret.txt"),
                |_, v| ensure(paths(v).is_empty(), || format!("{v}")),
            ),
            allowed(
                "glob in a subdirectory skips its links",
                Call::Glob {
                    pattern: "**".into(),
                    path: Some("sub".into()),
                },
                |_, v| ensure(paths(v) == ["sub/inner.txt"], || format!("{v}")),
            ),
            allowed(
                "search below a deep link to outside finds nothing",
                search(SECRET_MARK, None, true),
                |_, v| {
                    ensure(paths(v).is_empty(), || format!("{v}"))?;
                    ensure(v["files_searched"] != 0, || format!("{v}"))
                },
            )
            .with_setup(plant_deep_link),
        ],
    );
}

/// A name that is not UTF-8 is reached by the name a listing shows (U+FFFD for its stray bytes):
/// links so named that lead out are refused by every tool as any link is, and `..` after such a
/// name still cannot climb out.
#[test]
fn names_that_are_not_utf8_reach_nothing_outside() {
    let e = |name, call| escape(name, call, WHY_LINK);
    run_cases(
        "names that are not UTF-8",
        vec![
            e("read a file link so named", read("lnk\u{FFFD}")).with_setup(plant_lossy_links),
            e("write a file link so named", write("lnk\u{FFFD}")).with_setup(plant_lossy_links),
            e("edit a file link so named", edit("lnk\u{FFFD}")).with_setup(plant_lossy_links),
            e("list a dir link so named", list("dlnk\u{FFFD}")).with_setup(plant_lossy_links),
            e(
                "read through a dir link so named",
                read("dlnk\u{FFFD}/secret.txt"),
            )
            .with_setup(plant_lossy_links),
            e(
                "write through a dir link so named",
                write("dlnk\u{FFFD}/new.txt"),
            )
            .with_setup(plant_lossy_links),
            e(
                "read through a dir so named, then a link out",
                read("d\u{FFFD}/out/secret.txt"),
            )
            .with_setup(plant_lossy_links),
            refused(
                "read .. after a name so named",
                read("d\u{FFFD}/../../outside/secret.txt"),
                ErrorCode::OutsideWorkspace,
                WHY_DOTDOT,
            )
            .with_setup(plant_lossy_links),
            e(
                "stat through a dir link so named",
                stat("dlnk\u{FFFD}/secret.txt"),
            )
            .with_setup(plant_lossy_links),
            e("search a dir link so named", search_in("dlnk\u{FFFD}"))
                .with_setup(plant_lossy_links),
            e("glob in a dir link so named", glob_in("dlnk\u{FFFD}")).with_setup(plant_lossy_links),
            e(
                "run with cwd a dir link so named",
                run_in("dlnk\u{FFFD}", &["ls"]),
            )
            .with_setup(plant_lossy_links),
            // A name looked up beyond a link out is never looked for outside: two names there
            // read the same, and the path is refused for the link, not for them.
            e(
                "read a name so named through a dir link so named",
                read("dlnk\u{FFFD}/s\u{FFFD}"),
            )
            .with_setup(plant_lossy_links),
            e(
                "read a name so named through a dir link",
                read("abs_dir_link/s\u{FFFD}"),
            )
            .with_setup(plant_lossy_links),
            allowed(
                "read the file inside so named",
                read("d\u{FFFD}/in\u{FFFD}.txt"),
                |_, v| ensure(v["content"] == INNER, || format!("{v}")),
            )
            .with_setup(plant_lossy_links),
        ],
    );
}

/// `lnk\xff` -> the outside secret, `dlnk\xff` -> the outside dir, and a directory `d\xff` holding
/// `in\xe9.txt` and `out` -> the outside dir.
fn plant_lossy_links(fx: &Fixture) {
    use std::os::unix::ffi::OsStrExt;
    let root = fx.root();
    let raw = |bytes: &[u8]| std::ffi::OsStr::from_bytes(bytes).to_owned();
    std::os::unix::fs::symlink(fx.outside().join("secret.txt"), root.join(raw(b"lnk\xff")))
        .unwrap();
    std::os::unix::fs::symlink(fx.outside(), root.join(raw(b"dlnk\xff"))).unwrap();
    let dir = root.join(raw(b"d\xff"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join(raw(b"in\xe9.txt")), INNER).unwrap();
    std::os::unix::fs::symlink(fx.outside(), dir.join("out")).unwrap();
    // Outside, two names that read the same: only a lookup there could tell they are two.
    std::fs::write(fx.outside().join(raw(b"s\xe8")), SECRET).unwrap();
    std::fs::write(fx.outside().join(raw(b"s\xe9")), SECRET).unwrap();
}

/// `sub/a/b/c/out` -> the outside dir, four levels down.
fn plant_deep_link(fx: &Fixture) {
    fx.put("sub/a/b/c/leaf.txt", "leaf\n");
    fx.symlink(fx.outside(), "sub/a/b/c/out");
}

#[test]
fn list_dir_never_follows_links_at_any_depth() {
    run_cases(
        "deep listing",
        vec![
            allowed("list the root 8 deep", list_deep("", 8), |_, v| {
                nothing_below_links(v)?;
                // A file or directory is a bare string ("dir/"); only links and other kinds are
                // objects with a `kind`, so a link listed as a directory is missing here.
                let kinds: Vec<(String, String)> = v["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| {
                        [
                            "abs_dir_link",
                            "rel_dir_link",
                            "in_dir_link",
                            "proc_root_link",
                        ]
                        .contains(&e["path"].as_str().unwrap_or_default())
                    })
                    .map(|e| (e["path"].to_string(), e["kind"].to_string()))
                    .collect();
                ensure(
                    kinds.len() == 4 && kinds.iter().all(|(_, k)| k == "\"symlink\""),
                    || format!("links not reported as links: {kinds:?}"),
                )
            }),
            allowed("list sub 4 deep", list_deep("sub", 4), |_, v| {
                nothing_below_links(v)?;
                ensure(paths(v).contains(&"sub/deep_rel_link".to_owned()), || {
                    format!("{v}")
                })
            }),
            allowed(
                "list a deep link to outside without entering it",
                list_deep("", 10),
                |_, v| {
                    let ps = paths(v);
                    ensure(
                        ps.contains(&"sub/a/b/c/out".to_owned())
                            && ps.contains(&"sub/a/b/c/leaf.txt".to_owned())
                            && !ps.iter().any(|p| p.starts_with("sub/a/b/c/out/")),
                        || format!("{v}"),
                    )
                },
            )
            .with_setup(plant_deep_link),
            allowed(
                "list through an inside link does not enter links below it",
                list_deep("in_dir_link", 3),
                |_, v| {
                    let ps = paths(v);
                    ensure(
                        ps.contains(&"in_dir_link/deep_rel_link".to_owned())
                            && !ps
                                .iter()
                                .any(|p| p.starts_with("in_dir_link/deep_rel_link/")),
                        || format!("{v}"),
                    )
                },
            ),
        ],
    );
}

/// Guards the fixture: the secret really is reachable without the jail, so the refusals above
/// are not vacuous.
#[test]
fn the_secret_is_really_there() {
    let fx = Fixture::new();
    plant_traps(&fx);
    let through_link = std::fs::read_to_string(fx.root().join("abs_dir_link/secret.txt")).unwrap();
    assert_eq!(through_link, SECRET);
    assert!(Path::new(&fx.expand("{tmp}/root_evil/secret.txt")).exists());
}
