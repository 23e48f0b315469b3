//! `/api/v1/openapi.json`: the OpenAPI 3.0 document of the API. The paths are listed here; every
//! request body, response body and event schema comes from the Rust types the handlers use
//! ([`super::api`]), through schemars, so the document cannot drift from the code.

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Value, json};

use super::ErrorBody;
use super::api::{
    ArtifactCreated, ArtifactList, AuditPage, CreateWorkspace, HistoryView, SessionEvent,
    SessionView, SessionsPage, UploadArtifact, WorkspaceCreated, WorkspaceView,
};

fn body<T: JsonSchema>(generator: &mut SchemaGenerator) -> Value {
    json!({ "content": { "application/json": { "schema": generator.subschema_for::<T>() } } })
}

fn answer<T: JsonSchema>(generator: &mut SchemaGenerator, what: &str) -> Value {
    let mut v = body::<T>(generator);
    v["description"] = json!(what);
    v
}

fn id_param(name: &str, what: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": what,
            "schema": { "type": "string" } })
}

fn paging() -> Vec<Value> {
    vec![
        json!({ "name": "limit", "in": "query", "required": false,
                "description": "page size, 1 to 100 (default 20)",
                "schema": { "type": "integer", "minimum": 1, "maximum": 100, "default": 20 } }),
        json!({ "name": "nextToken", "in": "query", "required": false,
                "description": "the previous page's `nextToken` (opaque, tamper-proof)",
                "schema": { "type": "string" } }),
    ]
}

/// The document.
pub fn document() -> Value {
    let mut g = SchemaSettings::openapi3().into_generator();
    let error = |g: &mut SchemaGenerator, what: &str| answer::<ErrorBody>(g, what);
    let errors = |g: &mut SchemaGenerator| {
        json!({
            "400": error(g, "bad input: says what is wrong; nothing was stored"),
            "401": error(g, "no valid bearer token"),
            "404": error(g, "no such thing of this user's (another user's answers the same)"),
        })
    };
    let with = |mut base: Value, extra: Value| {
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        base
    };
    let binary = json!({ "description": "the artifact's content, with its content type (JSON for `session_history`)",
                         "content": { "*/*": { "schema": { "type": "string", "format": "binary" } } } });
    let ws = id_param("id", "workspace id");
    let sid = id_param("id", "session id");
    let art = id_param("artifactId", "artifact id");
    let mut paths = serde_json::Map::new();
    paths.insert("/api/v1/workspaces".into(), json!({
        "post": {
            "summary": "Create a workspace: `local` is idempotent by (user, localPath), `general` is always new",
            "requestBody": with(body::<CreateWorkspace>(&mut g), json!({"required": true})),
            "responses": with(errors(&mut g), json!({
                "201": answer::<WorkspaceCreated>(&mut g, "created"),
                "200": answer::<WorkspaceCreated>(&mut g, "the existing `local` workspace of that path"),
                "507": error(&mut g, "the user has as many workspaces as the quota allows (`quota_exceeded`); nothing was stored"),
            })),
        }
    }));
    paths.insert("/api/v1/workspaces/{id}".into(), json!({
        "parameters": [ws.clone()],
        "get": { "summary": "A workspace",
                 "responses": with(errors(&mut g), json!({ "200": answer::<WorkspaceView>(&mut g, "the workspace") })) },
        "delete": { "summary": "Delete a workspace, its artifacts and the history snapshots uploaded to it",
                    "responses": with(errors(&mut g), json!({ "204": { "description": "deleted" } })) },
    }));
    paths.insert("/api/v1/workspaces/{id}/artifacts".into(), json!({
        "parameters": [ws.clone()],
        "post": {
            "summary": "Upload a `tool_output`, a `file_diff`, or the session's `session_history` snapshot (replacing the previous one)",
            "requestBody": with(body::<UploadArtifact>(&mut g), json!({"required": true})),
            "responses": with(errors(&mut g), json!({
                "201": answer::<ArtifactCreated>(&mut g, "stored"),
                "409": error(&mut g, "a `general` workspace already holds another session"),
                "507": error(&mut g, "over the user's quota of uploaded bytes (`quota_exceeded`); nothing was stored"),
            })),
        }
    }));
    paths.insert("/api/v1/workspaces/{id}/artifacts/{artifactId}".into(), json!({
        "parameters": [ws.clone(), art.clone()],
        "get": { "summary": "An artifact's content", "responses": with(errors(&mut g), json!({ "200": binary.clone() })) },
    }));
    paths.insert("/api/v1/workspaces/{id}/sessions".into(), json!({
        "parameters": [ws],
        "get": { "summary": "The workspace's sessions, most recent activity first", "parameters": paging(),
                 "responses": with(errors(&mut g), json!({ "200": answer::<SessionsPage>(&mut g, "a page") })) },
    }));
    paths.insert("/api/v1/sessions".into(), json!({
        "get": { "summary": "The user's sessions, most recent activity first", "parameters": paging(),
                 "responses": with(errors(&mut g), json!({ "200": answer::<SessionsPage>(&mut g, "a page") })) },
    }));
    paths.insert("/api/v1/sessions/{id}".into(), json!({
        "parameters": [sid.clone()],
        "get": { "summary": "A session", "responses": with(errors(&mut g), json!({ "200": answer::<SessionView>(&mut g, "the session") })) },
    }));
    paths.insert("/api/v1/sessions/{id}/history".into(), json!({
        "parameters": [sid.clone()],
        "get": { "summary": "The conversation (`session.md`)", "responses": with(errors(&mut g), json!({ "200": answer::<HistoryView>(&mut g, "the conversation") })) },
    }));
    paths.insert("/api/v1/sessions/{id}/artifacts".into(), json!({
        "parameters": [sid.clone()],
        "get": { "summary": "The session's artifacts, oldest first", "parameters": paging(),
                 "responses": with(errors(&mut g), json!({ "200": answer::<ArtifactList>(&mut g, "a page") })) },
    }));
    paths.insert("/api/v1/sessions/{id}/artifacts/{artifactId}".into(), json!({
        "parameters": [sid.clone(), art],
        "get": { "summary": "An artifact's content", "responses": with(errors(&mut g), json!({ "200": binary })) },
    }));
    paths.insert("/api/v1/sessions/{id}/audit".into(), json!({
        "parameters": [sid.clone()],
        "get": { "summary": "The tool calls, oldest first", "parameters": paging(),
                 "responses": with(errors(&mut g), json!({ "200": answer::<AuditPage>(&mut g, "a page") })) },
    }));
    let event = g.subschema_for::<SessionEvent>();
    paths.insert("/api/v1/sessions/{id}/events".into(), json!({
        "parameters": [sid],
        "get": { "summary": "Server-sent events: `ready`, then `call_started`, `call_waiting`, `call_decided`, `call_ended` (a call in progress), `call` (its record), `message`, `history`, `artifact` (and `lagged`) as they happen; each `data` is a SessionEvent",
                 "responses": with(errors(&mut g), json!({ "200": { "description": "an event stream",
                     "content": { "text/event-stream": { "schema": event } } } })) },
    }));
    let schemas = g.take_definitions(true);
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Monad workspace service",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Sessions, their history, audit log and artifacts (seed 004). Every request needs `Authorization: Bearer <token>` (`monad-server token create`).",
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
        "security": [ { "bearer": [] } ],
        "paths": paths,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_schema_reference_resolves_in_the_document() {
        let doc = super::document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for name in [
            "UploadArtifact",
            "SessionsPage",
            "ArtifactCreated",
            "AuditPage",
        ] {
            assert!(schemas.contains_key(name), "{name} missing");
        }
        for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(schemas.contains_key(name), "dangling $ref to {name}");
        }
        // Field names are seed 004's.
        let upload = serde_json::to_string(&schemas["UploadArtifact"]).unwrap();
        for field in ["sessionId", "artifactName", "contentBase64", "contentType"] {
            assert!(upload.contains(field), "{field} missing");
        }
    }
}
