//! `monad-client call`: what it prints and how it exits, as pure functions of the answer.
//!
//! By default standard output gets the text a model gets ([`monad_protocol::render::text`]),
//! made safe for a terminal; `--json` prints the whole answer as JSON instead. The exit code says
//! how the call went, apart from clap's usage error (2):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | the tool succeeded (for `run_command`: the command exited 0, or runs on in the background) |
//! | 1 | the tool failed (not found, denied, invalid arguments, ...), or `monad-client` itself did (not logged in, server unreachable) |
//! | 2 | usage error: unknown tool, bad flag, the arguments (`ARGS` or `--args`) not a JSON object or not readable |
//! | 3 | `run_command` ran but the command exited non-zero, was killed by a signal or timed out; or `process_read` reports a process that ended so |

use monad_protocol::render;
use monad_protocol::text::{json_safe, printable, printable_lines};
use monad_protocol::tools::{ProcessReadResult, RunCommandResult};
use monad_protocol::wire::Outcome;
use monad_protocol::{ToolError, ToolName};
use serde_json::Value;

use crate::agent::CallReply;

/// Exit code: the tool failed, or the client did.
pub const EXIT_TOOL_ERROR: u8 = 1;
/// Exit code: clap's usage error.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the command ran and failed (non-zero exit, a signal, the time limit).
pub const EXIT_COMMAND_FAILED: u8 = 3;

/// The exit code of a call of `tool` that ended with `outcome`.
pub fn exit_code(tool: ToolName, outcome: &Outcome) -> u8 {
    let result = match outcome {
        Outcome::Ok { result } => result,
        Outcome::Error { .. } => return EXIT_TOOL_ERROR,
    };
    let failed = |exit_code: Option<i32>, signal: Option<i32>, timed_out: bool| {
        timed_out || signal.is_some() || exit_code.is_some_and(|c| c != 0)
    };
    let command_failed = match tool {
        ToolName::RunCommand => result
            .decode::<RunCommandResult>()
            .is_ok_and(|r| r.process.is_none() && failed(r.exit_code, r.signal, r.timed_out)),
        ToolName::ProcessRead => result
            .decode::<ProcessReadResult>()
            .is_ok_and(|r| !r.running && failed(r.exit_code, r.signal, r.timed_out)),
        _ => false,
    };
    if command_failed {
        EXIT_COMMAND_FAILED
    } else {
        0
    }
}

/// What `call` prints: standard output and standard error, each safe for a terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Printed {
    /// For standard output (ends with a line break unless empty).
    pub stdout: String,
    /// For standard error (ends with a line break unless empty).
    pub stderr: String,
}

/// The output of a call of `tool`: the model's text (or, with `json`, the whole answer).
pub fn printed(tool: ToolName, reply: &CallReply, json: bool) -> Printed {
    if json {
        let answer = serde_json::json!({
            "workspace": reply.workspace,
            "outcome": reply.outcome,
        });
        let text = serde_json::to_string_pretty(&answer).unwrap_or_else(|_| answer.to_string());
        return Printed {
            stdout: format!("{}\n", json_safe(&text)),
            stderr: String::new(),
        };
    }
    match &reply.outcome {
        Outcome::Ok { result } => Printed {
            stdout: line(&printable_lines(&render::text(
                tool,
                reply.workspace.as_ref(),
                &result.value(),
            ))),
            stderr: String::new(),
        },
        Outcome::Error { error } => Printed {
            stdout: String::new(),
            stderr: line(&error_line(reply, error)),
        },
    }
}

fn error_line(reply: &CallReply, error: &ToolError) -> String {
    let place = match &reply.workspace {
        Some(w) => format!(
            " (in workspace `{}`, {})",
            printable(&w.name),
            printable(&w.uri)
        ),
        None => String::new(),
    };
    // A message of several lines keeps them; what else could move the cursor is escaped. One
    // that names a huge argument (a path of 100 KB) is cut as a model gets it (`--json` keeps
    // it whole).
    let error = monad_protocol::mcp::shortened(error);
    format!(
        "monad-client: {}: {}{place}",
        error.code,
        printable_lines(&error.message)
    )
}

fn line(text: &str) -> String {
    format!("{text}\n")
}

/// The `tools` listing: one line per tool, its name and what it does.
pub fn tools_list() -> String {
    let width = ToolName::ALL
        .iter()
        .map(|t| t.as_str().len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for tool in ToolName::ALL {
        out.push_str(&format!(
            "{:<width$}  {}\n",
            tool.as_str(),
            render::tool_summary(tool)
        ));
    }
    out.push_str("\n`monad-client tools TOOL` (or `call TOOL --help`) shows a tool's arguments.\n");
    out
}

/// `tools --json`: every tool (or one) with its description and input and output schemas.
pub fn tools_json(only: Option<ToolName>) -> Value {
    let one = |t: ToolName| {
        serde_json::json!({
            "name": t.as_str(),
            "class": t.class().as_str(),
            "description": t.description(),
            "input_schema": t.input_schema(),
            "output_schema": t.output_schema(),
        })
    };
    match only {
        Some(t) => one(t),
        None => Value::Array(ToolName::ALL.into_iter().map(one).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monad_protocol::ErrorCode;
    use monad_protocol::wire::WorkspaceRef;
    use serde_json::json;

    fn ok(result: Value) -> Outcome {
        Outcome::Ok {
            result: result.into(),
        }
    }

    fn command(extra: Value) -> Value {
        let mut base = json!({"timed_out": false, "stdout": "", "stderr": "",
                              "stdout_truncated": false, "stderr_truncated": false,
                              "duration_ms": 1, "sandbox": "landlock"});
        base.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        base
    }

    #[test]
    fn exit_codes_tell_a_tool_error_from_a_failed_command() {
        let run = ToolName::RunCommand;
        assert_eq!(exit_code(run, &ok(command(json!({"exit_code": 0})))), 0);
        assert_eq!(exit_code(run, &ok(command(json!({"exit_code": 1})))), 3);
        assert_eq!(exit_code(run, &ok(command(json!({"signal": 9})))), 3);
        assert_eq!(
            exit_code(run, &ok(command(json!({"timed_out": true, "signal": 9})))),
            3
        );
        assert_eq!(
            exit_code(run, &ok(command(json!({"process": "p1"})))),
            0,
            "runs on in the background"
        );
        let error = Outcome::Error {
            error: ToolError::new(ErrorCode::Denied, "no"),
        };
        assert_eq!(exit_code(ToolName::ReadFile, &error), EXIT_TOOL_ERROR);
        assert_eq!(exit_code(run, &error), EXIT_TOOL_ERROR);
        let read = |v: Value| {
            let mut base = json!({"process": "p", "stdout": "", "stderr": "", "duration_ms": 1});
            base.as_object_mut()
                .unwrap()
                .extend(v.as_object().unwrap().clone());
            exit_code(ToolName::ProcessRead, &ok(base))
        };
        assert_eq!(read(json!({"running": true})), 0);
        assert_eq!(read(json!({"running": false, "exit_code": 0})), 0);
        assert_eq!(read(json!({"running": false, "exit_code": 2})), 3);
        assert_eq!(exit_code(ToolName::ListDir, &ok(json!({"anything": 1}))), 0);
        assert!(![0, EXIT_TOOL_ERROR, EXIT_COMMAND_FAILED].contains(&EXIT_USAGE));
    }

    #[test]
    fn text_is_the_models_made_safe_and_json_is_the_whole_answer() {
        let reply = CallReply {
            workspace: Some(WorkspaceRef {
                name: "laptop".into(),
                uri: "mac:~/p".into(),
            }),
            outcome: ok(json!({"paths": ["a\u{1b}[2J.txt"], "truncated": false})),
        };
        let shown = printed(ToolName::Glob, &reply, false);
        assert_eq!(
            shown.stdout,
            "1 path in workspace laptop:\na\\u{1b}[2J.txt\n"
        );
        assert_eq!(shown.stderr, "");
        let json = printed(ToolName::Glob, &reply, true);
        let back: Value = serde_json::from_str(&json.stdout).unwrap();
        assert_eq!(back["outcome"]["status"], "ok");
        assert_eq!(back["outcome"]["result"]["paths"][0], "a\u{1b}[2J.txt");
        assert_eq!(back["workspace"]["name"], "laptop");
        assert!(!json.stdout.contains('\u{1b}'));

        let failed = CallReply {
            workspace: None,
            outcome: Outcome::Error {
                error: ToolError::new(ErrorCode::NotFound, "no such file `x\u{202e}`"),
            },
        };
        let shown = printed(ToolName::ReadFile, &failed, false);
        assert_eq!(shown.stdout, "");
        assert_eq!(
            shown.stderr,
            "monad-client: not_found: no such file `x\\u{202e}`\n"
        );

        // An error naming a huge argument is cut as a model gets it; `--json` keeps it whole.
        let huge = format!("`{}` does not exist", "d/".repeat(50_000));
        let failed = CallReply {
            workspace: None,
            outcome: Outcome::Error {
                error: ToolError::new(ErrorCode::NotFound, huge.clone()),
            },
        };
        let shown = printed(ToolName::ReadFile, &failed, false);
        assert!(shown.stderr.len() < 5_000, "{}", shown.stderr.len());
        assert!(shown.stderr.contains("bytes left out"), "{}", shown.stderr);
        assert!(shown.stderr.ends_with("does not exist\n"));
        let json = printed(ToolName::ReadFile, &failed, true);
        assert!(json.stdout.contains(&huge));
    }

    /// Regression: a tool error of several lines (a command's own message, say) was squashed
    /// into one line of `\u{a}` escapes.
    #[test]
    fn a_tool_error_keeps_its_lines_and_its_control_characters_stay_escaped() {
        let failed = CallReply {
            workspace: Some(WorkspaceRef {
                name: "laptop".into(),
                uri: "mac:/p".into(),
            }),
            outcome: Outcome::Error {
                error: ToolError::new(
                    ErrorCode::InvalidArguments,
                    "two problems:\n- first\r\n- second \u{1b}[2J",
                ),
            },
        };
        let shown = printed(ToolName::RunCommand, &failed, false);
        assert_eq!(
            shown.stderr,
            "monad-client: invalid_arguments: two problems:\n- first\\u{d}\n- second \
             \\u{1b}[2J (in workspace `laptop`, mac:/p)\n"
        );
    }

    #[test]
    fn the_tools_listing_names_every_tool() {
        let list = tools_list();
        for tool in ToolName::ALL {
            assert!(list.contains(&format!("{tool} ")), "{tool}");
        }
        let all = tools_json(None);
        assert_eq!(all.as_array().unwrap().len(), ToolName::ALL.len());
        assert_eq!(
            tools_json(Some(ToolName::Glob))["input_schema"]["required"],
            json!(["pattern"])
        );
    }
}
