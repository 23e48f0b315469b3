//! The Monad client: it attaches a folder on this machine to a session as a restricted
//! workspace, asks its user to approve what agents do there, and bridges agents to the server.
//!
//! So far it holds no behaviour of its own: attached folders will run their tools in
//! [`monad_sandbox::Sandbox`], with approvals enforced here, on the client.
#![deny(missing_docs)]

pub use monad_sandbox::Sandbox;
