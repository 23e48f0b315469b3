//! How a thread doing background work asks the scheduler not to get in the way of the answers.

/// Marks the calling thread as background work (Linux `SCHED_BATCH`): it keeps its fair share of
/// a core, but its waking up no longer preempts the thread running there.
///
/// For threads whose work follows an answer rather than making it, such as the server's
/// recorder, which writes a call's audit line and artifacts after the agent has its result, and
/// an attachment's line printer. With every process of a call on two cores, waking the recorder
/// for its batch preempted the process reading the answer (the AI host's client) in about one
/// call in ten, and each preemption is time that call waits (`docs/benchmarks.md`, the Python
/// SDK cases' twelfth round). Elsewhere it does nothing.
pub fn run_as_background() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use nix::libc;
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` only reads `param`, which lives across the call; pid 0
        // is the calling thread, the only one whose policy changes.
        let done = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if done != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether the calling thread runs as background work ([`run_as_background`]); false where
/// there is no such thing. For the tests of the threads that ask for it, in this crate and
/// others (which have no `unsafe` code of their own).
#[doc(hidden)]
pub fn is_background() -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use nix::libc;
        // SAFETY: `sched_getscheduler` reads the policy of the calling thread (pid 0) and takes
        // nothing else.
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(policy == libc::SCHED_BATCH)
    }
    #[cfg(not(target_os = "linux"))]
    Ok(false)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_is_scheduled_as_batch_work_and_the_others_are_not() {
        let mine = is_background().unwrap();
        let there = std::thread::spawn(|| {
            run_as_background().unwrap();
            is_background().unwrap()
        })
        .join()
        .unwrap();
        assert!(there);
        // The thread that did not ask keeps the policy it had.
        assert_eq!(is_background().unwrap(), mine);
    }
}
