//! Routing, as a pure function: which workspace runs a call.
//!
//! 1. A call that names `workspace` goes there, or fails with `workspace_not_found`.
//! 2. Otherwise the first workspace in priority order (primary, then attached in attach order)
//!    that is online, offers the tool and, for tools that read an existing path, contains that
//!    path. Containment needs I/O, so the plan lists the candidates and the executor probes them
//!    in order.
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
    /// Run in the first of these (in order) that contains `path`.
    FirstContaining {
        /// Indexes of the candidates, in priority order.
        candidates: Vec<usize>,
        /// The path that must exist.
        path: String,
    },
}

/// Routes `tool` with an optional explicit `target` (short name or URI) and the call's `path`.
pub fn plan(
    tool: ToolName,
    target: Option<&str>,
    path: Option<&str>,
    workspaces: &[View<'_>],
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
    let candidates: Vec<usize> = workspaces
        .iter()
        .enumerate()
        .filter(|(_, w)| w.online && w.offers)
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return Err(ToolError::new(
            ErrorCode::NotFound,
            format!(
                "no online workspace offers `{tool}`; tried: {}",
                names(workspaces.iter())
            ),
        ));
    }
    match path {
        Some(path) if needs_existing_path(tool) => Ok(Plan::FirstContaining {
            candidates,
            path: path.to_owned(),
        }),
        _ => Ok(Plan::Run(candidates[0])),
    }
}

/// Tools whose `path` argument must name something that already exists.
pub fn needs_existing_path(tool: ToolName) -> bool {
    tool.reads_existing_path()
        || matches!(tool, ToolName::ListDir | ToolName::Search | ToolName::Glob)
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

    #[test]
    fn explicit_target_by_name_or_uri_wins() {
        let ws = [view("primary", true, true), view("lap", true, true)];
        assert_eq!(
            plan(ToolName::ReadFile, Some("lap"), Some("a"), &ws),
            Ok(Plan::Run(1))
        );
        assert_eq!(
            plan(ToolName::ReadFile, Some("host:lap"), None, &ws),
            Ok(Plan::Run(1))
        );
        let err = plan(ToolName::ReadFile, Some("nope"), None, &ws).unwrap_err();
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
        let err = plan(ToolName::ReadFile, Some("lap"), None, &ws).unwrap_err();
        assert_eq!(err.code, ErrorCode::WorkspaceDisconnected);
        let err = plan(ToolName::RunCommand, Some("ro"), None, &ws).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArguments);
    }

    #[test]
    fn existing_path_tools_probe_candidates_in_priority_order() {
        let ws = [
            view("primary", true, true),
            view("off", false, true),
            view("a", true, true),
            view("b", true, false),
            view("c", true, true),
        ];
        assert_eq!(
            plan(ToolName::ReadFile, None, Some("x"), &ws),
            Ok(Plan::FirstContaining {
                candidates: vec![0, 2, 4],
                path: "x".into()
            })
        );
        // Writes create paths: the first workspace that offers the tool.
        assert_eq!(
            plan(ToolName::WriteFile, None, Some("x"), &ws),
            Ok(Plan::Run(0))
        );
        // No path: the first workspace that offers the tool.
        assert_eq!(plan(ToolName::ListDir, None, None, &ws), Ok(Plan::Run(0)));
    }

    #[test]
    fn nothing_offering_the_tool_is_not_found_listing_what_was_tried() {
        let ws = [view("primary", true, false), view("lap", false, true)];
        let err = plan(ToolName::RunCommand, None, None, &ws).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(
            err.message.contains("primary, lap (offline)"),
            "{}",
            err.message
        );
        let err = not_in_any("x", &["primary", "lap"]);
        assert!(err.message.contains("tried: primary, lap"));
    }
}
