//! The session tools, which the server answers itself: `workspaces` (the session's
//! workspaces, its focus and where un-targeted calls go), `memory_store` and `memory_recall`
//! (notes kept as `memory/<key>.md` in the primary workspace).

use monad_protocol::tools::{MemoryRecallArgs, MemoryStoreArgs, WorkspacesArgs, WorkspacesResult};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::{Value, json};

use crate::route;
use crate::session::Session;

/// Longest memory key.
const MAX_KEY_LEN: usize = 100;

fn parse<A: serde::de::DeserializeOwned>(tool: ToolName, args: Value) -> Result<A, ToolError> {
    tool.decode_args(args)
        .map_err(|why| ToolError::new(ErrorCode::InvalidArguments, why))
}

pub(super) fn workspaces(session: &Session, args: &Value) -> Result<Value, ToolError> {
    let _: WorkspacesArgs = parse(ToolName::Workspaces, args.clone())?;
    let list: Vec<_> = session.workspaces().into_iter().map(|s| s.info).collect();
    let focus = session
        .focus()
        .filter(|f| list.iter().any(|w| &w.name == f));
    // Where calls go now: an offline focus stays the focus, and says so.
    let views: Vec<route::View<'_>> = list
        .iter()
        .map(|w| route::View {
            name: &w.name,
            uri: &w.uri,
            online: w.online,
            offers: w.tools.contains(&ToolName::WriteFile),
        })
        .collect();
    let routing = route::describe(
        &views,
        focus
            .as_ref()
            .and_then(|f| list.iter().position(|w| &w.name == f)),
    );
    let result = WorkspacesResult {
        session: session.id.clone(),
        focus,
        routing,
        workspaces: list,
    };
    serde_json::to_value(result).map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))
}

/// A memory key: 1 to 100 of `A-Z a-z 0-9 . _ -`, not starting with a dot.
fn check_key(key: &str) -> Result<(), ToolError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "memory key `{key}` must be 1 to {MAX_KEY_LEN} letters, digits, `.`, `_` or `-`, \
                 not starting with `.`"
            ),
        ))
    }
}

pub(super) async fn memory_store(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryStoreArgs = parse(ToolName::MemoryStore, args)?;
    check_key(&args.key)?;
    let write = json!({
        "path": format!("memory/{}.md", args.key),
        "content": args.text,
        "create_parents": true,
    });
    session
        .primary
        .sandbox()
        .await?
        .call(ToolName::WriteFile, write)
        .await
        .map_err(|e| e.to_tool_error())?;
    Ok(json!({ "key": args.key, "stored": true }))
}

pub(super) async fn memory_recall(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryRecallArgs = parse(ToolName::MemoryRecall, args)?;
    let sandbox = session.primary.sandbox().await?;
    let query = args.query.map(|q| q.to_lowercase());
    tokio::task::spawn_blocking(move || {
        let listing = match sandbox.list_dir(&monad_protocol::tools::ListDirArgs {
            path: Some("memory".into()),
            depth: None,
            include_hidden: None,
            workspace: None,
        }) {
            Ok(listing) => listing,
            Err(e) if e.code() == ErrorCode::NotFound => {
                return Ok(json!({ "notes": [] }));
            }
            Err(e) => return Err(e.to_tool_error()),
        };
        let mut notes = Vec::new();
        let mut kept = 0u64;
        for entry in listing.entries {
            let Some(key) = entry
                .path
                .strip_prefix("memory/")
                .and_then(|n| n.strip_suffix(".md"))
            else {
                continue;
            };
            let Ok(file) = sandbox.read_file(&monad_protocol::tools::ReadFileArgs {
                path: entry.path.clone(),
                offset: None,
                limit: None,
                workspace: None,
            }) else {
                continue;
            };
            kept += 1;
            let matches = query.as_deref().is_none_or(|q| {
                key.to_lowercase().contains(q) || file.content.to_lowercase().contains(q)
            });
            if matches {
                notes.push(json!({ "key": key, "text": file.content }));
            }
        }
        // Whether the memory holds others: "no notes" would read as an empty memory.
        let others = kept - notes.len() as u64;
        Ok(if others > 0 {
            json!({ "notes": notes, "not_matching": others })
        } else {
            json!({ "notes": notes })
        })
    })
    .await
    .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?
}
