//! Routing, as a pure function: which workspace runs a call.
//!
//! 1. A call that names `workspace` goes there, or fails with `workspace_not_found`.
//! 2. Otherwise the session's **focus** workspace first, when it has one (set by
//!    `attach --focus`, or from an MCP host's roots), then priority order (primary, then attached
//!    in attach order): the first that is online, offers the tool and, for tools that touch an
//!    existing path (reads, and writes or edits of a file that exists), contains that path. A
//!    write of a file that exists nowhere goes to the first of them (the focus, else the
//!    primary), so a file is never read from one workspace and written to another. Containment
//!    needs I/O, so the plan lists the candidates and the executor probes them in order.
//! 3. Otherwise `not_found`, listing the workspaces that were tried.

use monad_protocol::{ErrorCode, ToolError, ToolName};

/// What routing needs to know about one workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View<'a> {
    /// Short name.
    pub name: &'a str,
    /// URI.
    pub uri: &'a str,
    /// False while its client is disconnected.
    pub online: bool,
    /// Whether it offers the tool being routed.
    pub offers: bool,
}

/// Where a call should go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Run in the workspace at this index.
    Run(usize),
    /// Run in the first of these (in order) that contains `path`; when none does, in
    /// `otherwise` (a write of a new file), else fail with [`not_in_any`].
    FirstContaining {
        /// Indexes of the candidates, the focus first, then in priority order.
        candidates: Vec<usize>,
        /// The path that must exist.
        path: String,
        /// Where the call goes when no candidate contains the path.
        otherwise: Option<usize>,
    },
}

/// Routes `tool` with an optional explicit `target` (short name or URI) and the call's `path`,
/// among `workspaces` (primary first, then attached in attach order), of which the one at
/// `focus` (when given) is tried first.
pub fn plan(
    tool: ToolName,
    target: Option<&str>,
    path: Option<&str>,
    workspaces: &[View<'_>],
    focus: Option<usize>,
) -> Result<Plan, ToolError> {
    if let Some(target) = target {
        let Some(index) = workspaces
            .iter()
            .position(|w| w.name == target || w.uri == target)
        else {
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotFound,
                format!(
                    "no workspace `{target}` in this session; it has: {}",
                    names(workspaces.iter())
                ),
            ));
        };
        let w = &workspaces[index];
        if !w.offers {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                format!("workspace `{}` does not offer `{tool}`", w.name),
            ));
        }
        if !w.online {
            return Err(ToolError::new(
                ErrorCode::WorkspaceDisconnected,
                format!(
                    "workspace `{}` ({}) is disconnected; its client must reconnect before it \
                     can run tools",
                    w.name, w.uri
                ),
            ));
        }
        return Ok(Plan::Run(index));
    }
    let candidates: Vec<usize> = order(workspaces.len(), focus)
        .filter(|&i| workspaces[i].online && workspaces[i].offers)
        .collect();
    if candidates.is_empty() {
        return Err(ToolError::new(
            ErrorCode::NotFound,
            format!(
                "no online workspace offers `{tool}`; tried: {}",
                names(order(workspaces.len(), focus).map(|i| &workspaces[i]))
            ),
        ));
    }
    match path {
        Some(path) if needs_existing_path(tool) => Ok(Plan::FirstContaining {
            candidates,
            path: path.to_owned(),
            otherwise: None,
        }),
        Some(path) if tool == ToolName::WriteFile => Ok(Plan::FirstContaining {
            otherwise: Some(candidates[0]),
            candidates,
            path: path.to_owned(),
        }),
        _ => Ok(Plan::Run(candidates[0])),
    }
}

/// The indexes of `count` workspaces in the order un-targeted calls try them: the focus first
/// (when it is one of them), then the rest in priority order.
pub fn order(count: usize, focus: Option<usize>) -> impl Iterator<Item = usize> {
    let focus = focus.filter(|&f| f < count);
    focus
        .into_iter()
        .chain((0..count).filter(move |&i| Some(i) != focus))
}

/// Tools whose `path` argument must name something that already exists.
pub fn needs_existing_path(tool: ToolName) -> bool {
    tool.reads_existing_path()
        || matches!(tool, ToolName::ListDir | ToolName::Search | ToolName::Glob)
}

/// Where calls that do not name `workspace` go, in one paragraph for a model (the `routing`
/// field of `workspaces`): `names` are the session's workspaces in priority order, `focus` the
/// index of the focus among them.
pub fn describe(names: &[&str], focus: Option<usize>) -> String {
    let focus = focus.filter(|&f| f < names.len());
    let ordered: Vec<String> = order(names.len(), focus)
        .map(|i| format!("`{}`", names[i]))
        .collect();
    let first = ordered.first().cloned().unwrap_or_else(|| "none".into());
    let lead = match focus {
        Some(f) => format!(
            "Calls without `workspace` go to the focus workspace `{}` first, then the others in \
             this order: {}.",
            names[f],
            ordered.join(", ")
        ),
        None => format!(
            "This session has no focus workspace: calls without `workspace` try the workspaces \
             in this order: {}.",
            ordered.join(", ")
        ),
    };
    format!(
        "{lead} A call with a path that must exist (read_file, stat, edit_file, and list_dir, \
         search or glob given a `path`) runs in the first that has the path; write_file of a \
         file that exists writes where it is, and a new file goes to {first}; anything else \
         (list_dir, search or glob of the whole root, run_command) runs in {first}. Pass \
         `workspace` to choose."
    )
}

/// The error when no candidate contains the path.
pub fn not_in_any(path: &str, tried: &[&str]) -> ToolError {
    ToolError::new(
        ErrorCode::NotFound,
        format!(
            "`{path}` does not exist in any workspace; tried: {}",
            if tried.is_empty() {
                "none".to_owned()
            } else {
                tried.join(", ")
            }
        ),
    )
}

fn names<'a>(workspaces: impl Iterator<Item = &'a View<'a>>) -> String {
    let all: Vec<String> = workspaces
        .map(|w| {
            if w.online {
                w.name.to_owned()
            } else {
                format!("{} (offline)", w.name)
            }
        })
        .collect();
    if all.is_empty() {
        "none".to_owned()
    } else {
        all.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &'static str, online: bool, offers: bool) -> View<'static> {
        View {
            name,
            uri: Box::leak(format!("host:{name}").into_boxed_str()),
            online,
            offers,
        }
    }

    fn containing(candidates: Vec<usize>, otherwise: Option<usize>) -> Plan {
        Plan::FirstContaining {
            candidates,
            path: "x".into(),
            otherwise,
        }
    }

    #[test]
    fn explicit_target_by_name_or_uri_wins_over_the_focus() {
        let ws = [view("primary", true, true), view("lap", true, true)];
        assert_eq!(
            plan(ToolName::ReadFile, Some("lap"), Some("a"), &ws, None),
            Ok(Plan::Run(1))
        );
        assert_eq!(
            plan(ToolName::ReadFile, Some("host:lap"), None, &ws, None),
            Ok(Plan::Run(1))
        );
        assert_eq!(
            plan(
                ToolName::WriteFile,
                Some("primary"),
                Some("x"),
                &ws,
                Some(1)
            ),
            Ok(Plan::Run(0))
        );
        let err = plan(ToolName::ReadFile, Some("nope"), None, &ws, Some(1)).unwrap_err();
        assert_eq!(err.code, ErrorCode::WorkspaceNotFound);
        assert!(err.message.contains("primary, lap"), "{}", err.message);
    }

    #[test]
    fn explicit_target_offline_or_without_the_tool_fails_clearly() {
        let ws = [
            view("primary", true, true),
            view("lap", false, true),
            view("ro", true, false),
        ];
        let err = plan(ToolName::ReadFile, Some("lap"), None, &ws, None).unwrap_err();
        assert_eq!(err.code, ErrorCode::WorkspaceDisconnected);
        let err = plan(ToolName::RunCommand, Some("ro"), None, &ws, None).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArguments);
    }

    #[test]
    fn existing_path_tools_probe_candidates_in_priority_order_without_a_focus() {
        let ws = [
            view("primary", true, true),
            view("off", false, true),
            view("a", true, true),
            view("b", true, false),
            view("c", true, true),
        ];
        for tool in [
            ToolName::ReadFile,
            ToolName::Stat,
            ToolName::EditFile,
            ToolName::ListDir,
            ToolName::Search,
            ToolName::Glob,
        ] {
            assert_eq!(
                plan(tool, None, Some("x"), &ws, None),
                Ok(containing(vec![0, 2, 4], None)),
                "{tool}"
            );
        }
    }

    #[test]
    fn the_focus_is_tried_first_for_paths_that_must_exist() {
        let ws = [
            view("primary", true, true),
            view("a", true, true),
            view("lap", true, true),
        ];
        for tool in [ToolName::ReadFile, ToolName::EditFile, ToolName::ListDir] {
            assert_eq!(
                plan(tool, None, Some("x"), &ws, Some(2)),
                Ok(containing(vec![2, 0, 1], None)),
                "{tool}"
            );
        }
    }

    #[test]
    fn a_write_goes_where_the_file_exists_else_to_the_focus_else_the_primary() {
        let ws = [
            view("primary", true, true),
            view("a", true, true),
            view("lap", true, true),
        ];
        // Where it exists first; a new file to the first candidate.
        assert_eq!(
            plan(ToolName::WriteFile, None, Some("x"), &ws, None),
            Ok(containing(vec![0, 1, 2], Some(0)))
        );
        assert_eq!(
            plan(ToolName::WriteFile, None, Some("x"), &ws, Some(2)),
            Ok(containing(vec![2, 0, 1], Some(2)))
        );
        // A focus that cannot take the write (offline, or without the tool) is passed over.
        let ws = [view("primary", true, true), view("lap", false, true)];
        assert_eq!(
            plan(ToolName::WriteFile, None, Some("x"), &ws, Some(1)),
            Ok(containing(vec![0], Some(0)))
        );
    }

    #[test]
    fn calls_without_a_path_run_in_the_focus_else_the_first_that_offers_the_tool() {
        let ws = [
            view("primary", true, true),
            view("lap", true, true),
            view("ro", true, false),
        ];
        for tool in [
            ToolName::ListDir,
            ToolName::Search,
            ToolName::Glob,
            ToolName::RunCommand,
        ] {
            assert_eq!(
                plan(tool, None, None, &ws, None),
                Ok(Plan::Run(0)),
                "{tool}"
            );
            assert_eq!(
                plan(tool, None, None, &ws, Some(1)),
                Ok(Plan::Run(1)),
                "{tool}"
            );
        }
        // A focus without the tool: the next in priority order.
        assert_eq!(
            plan(ToolName::RunCommand, None, None, &ws, Some(2)),
            Ok(Plan::Run(0))
        );
        // A focus index that is not a workspace (it went meanwhile) is ignored.
        assert_eq!(
            plan(ToolName::RunCommand, None, None, &ws, Some(9)),
            Ok(Plan::Run(0))
        );
    }

    #[test]
    fn nothing_offering_the_tool_is_not_found_listing_what_was_tried() {
        let ws = [view("primary", true, false), view("lap", false, true)];
        let err = plan(ToolName::RunCommand, None, None, &ws, None).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(
            err.message.contains("primary, lap (offline)"),
            "{}",
            err.message
        );
        let err = plan(ToolName::RunCommand, None, None, &ws, Some(1)).unwrap_err();
        assert!(
            err.message.contains("lap (offline), primary"),
            "the focus is listed first: {}",
            err.message
        );
        let err = not_in_any("x", &["primary", "lap"]);
        assert!(err.message.contains("tried: primary, lap"));
    }

    #[test]
    fn the_order_puts_the_focus_first_and_keeps_the_rest() {
        assert_eq!(order(3, None).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(3, Some(2)).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(order(3, Some(0)).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(3, Some(7)).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(0, Some(0)).count(), 0);
    }

    #[test]
    fn the_routing_sentence_names_the_focus_and_the_order() {
        let text = describe(&["primary", "a", "lap"], Some(2));
        assert!(
            text.starts_with(
                "Calls without `workspace` go to the focus workspace `lap` first, then the \
                 others in this order: `lap`, `primary`, `a`."
            ),
            "{text}"
        );
        assert!(text.contains("a new file goes to `lap`"), "{text}");
        let text = describe(&["primary", "lap"], None);
        assert!(text.contains("no focus workspace"), "{text}");
        assert!(text.contains("`primary`, `lap`"), "{text}");
        assert!(text.contains("a new file goes to `primary`"), "{text}");
    }
}
