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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The scheduling policy of this process's thread `tid` (`/proc`'s `stat`, field 41).
    fn policy(tid: i32) -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // The command name, in parentheses, may hold spaces: count fields after it.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(38).unwrap().parse().unwrap()
    }

    #[test]
    fn a_background_thread_is_scheduled_as_batch_work_and_the_others_are_not() {
        let me = nix::unistd::gettid().as_raw();
        let mine = policy(me);
        let (tid, policy_there) = std::thread::spawn(|| {
            run_as_background().unwrap();
            let tid = nix::unistd::gettid().as_raw();
            (tid, policy(tid))
        })
        .join()
        .unwrap();
        assert_eq!(policy_there, nix::libc::SCHED_BATCH as u32, "thread {tid}");
        // The thread that did not ask keeps the policy it had.
        assert_eq!(policy(me), mine);
    }
}
