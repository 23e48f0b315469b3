//! Ending on a signal. `monad-client call`, `mcp` and `acp` act for someone who may stop them
//! (Ctrl-C, or a host that ends its server with SIGTERM, as the MCP SDKs do when they shut down).
//! They then close their connection to the server before exiting, so that the server cancels
//! what they had running at once: a call's approval prompt on the laptop is withdrawn and its
//! command stopped. A process that simply died left the server to notice when the connection
//! timed out, about 8 s later, and until then the folder's owner could still approve a call
//! whose caller was gone, and it ran.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, watched from when this is made: from then on they no longer end the
/// process by themselves, so it is made before the work it interrupts starts.
pub struct Interrupts {
    interrupt: Signal,
    terminate: Signal,
}

impl Interrupts {
    /// Starts watching for SIGINT and SIGTERM.
    pub fn watch() -> std::io::Result<Interrupts> {
        Ok(Interrupts {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next of them; returns the exit status of a process that a signal ended
    /// (128 + its number: 130 for SIGINT, 143 for SIGTERM), which shells and hosts expect.
    pub async fn next(&mut self) -> u8 {
        tokio::select! {
            _ = self.interrupt.recv() => 128 + 2,
            _ = self.terminate.recv() => 128 + 15,
        }
    }
}
